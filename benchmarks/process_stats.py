"""What a benchmark run costs the processes that run it: memory peaks and JVM warm-up.

* **Peak RSS per run** (``RssPeaks``): Linux keeps each process's resident-set high-water mark
  (``VmHWM`` in ``/proc/<pid>/status``); writing ``5`` to ``/proc/<pid>/clear_refs`` resets it
  to the current RSS. Reset before a run, read after it: the peak of that run, per process.
  Both sides of a comparison share the driver (this Python process and its Spark JVM), so a
  side's peak is read for the runs of that side only; memory the JVM took in an earlier run and
  kept (its heap does not shrink back) counts as resident for the later ones, so the JVM figure
  is an upper bound that grows with time. ``heap_peak_mb`` (from ``JvmStats``) is the JVM's own
  peak of used heap during the run, which does not carry over.
* **JVM counters** (``JvmStats``, through py4j and ``java.lang.management``): milliseconds the
  JIT compilers spent, garbage-collection milliseconds and count, classes loaded, and the peak
  of used heap since the last reset (summed over the heap pools: an upper bound of the peak of
  their sum). The deltas over a run say how much of it was the JVM warming up: a run that
  compiles or loads much more than its neighbours pays first-use costs.

Where ``/proc`` or the JVM is not there the figures are left out (never an error).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def parse_status_kb(text: str, field: str) -> int | None:
    """The value in kB of one ``/proc/<pid>/status`` field (``VmHWM``, ``VmRSS``), or None."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == field:
            parts = rest.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
                return int(parts[0])
    return None


def _status(pid: int, proc: Path = PROC) -> str | None:
    try:
        return (proc / str(pid) / "status").read_text()
    except OSError:
        return None


def peak_rss_mb(pid: int, proc: Path = PROC) -> float | None:
    text = _status(pid, proc)
    kb = parse_status_kb(text, "VmHWM") if text is not None else None
    return kb / 1024 if kb is not None else None


def reset_peak_rss(pid: int, proc: Path = PROC) -> bool:
    """Reset a process's RSS high-water mark (``clear_refs`` 5, Linux >= 4.0); False if not."""
    try:
        (proc / str(pid) / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def children_of(pid: int, proc: Path = PROC) -> list[int]:
    """Direct children (``/proc/<pid>/task/*/children``): the JVM's Python workers."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError):
                found.extend(int(c) for c in (task / "children").read_text().split())
    return sorted(found)


def driver_jvm_pid(spark: Any) -> int | None:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # no JVM (Spark Connect) or no py4j: leave the figure out
        return None


class RssPeaks:
    """Per run, the RSS peak of this Python process, the driver JVM and the JVM's children."""

    def __init__(self, spark: Any) -> None:
        self.pids = {"python": os.getpid()}
        jvm = driver_jvm_pid(spark)
        if jvm is not None:
            self.pids["jvm"] = jvm

    def reset(self) -> None:
        for pid in self._all():
            reset_peak_rss(pid)

    def _all(self) -> list[int]:
        extra = children_of(self.pids["jvm"]) if "jvm" in self.pids else []
        return [*self.pids.values(), *extra]

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            value = peak_rss_mb(pid)
            if value is not None:
                out[f"peak_rss_mb_{name}"] = value
        if "jvm" in self.pids:
            workers = [peak_rss_mb(c) for c in children_of(self.pids["jvm"])]
            out["peak_rss_mb_workers"] = sum(v for v in workers if v is not None)
        if out:
            out["peak_rss_mb_total"] = sum(out.values())
        return out


def deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` for the cumulative counters both have; gauges (``*_peak_*``) as read
    after."""
    out = {}
    for key, value in after.items():
        if "_peak_" in key:
            out[key] = value
        elif key in before:
            out[key] = value - before[key]
    return out


def sum_peaks(pools: Iterable[tuple[str, float]]) -> float:
    """Heap peak in MB from (pool type, peak bytes) pairs: the heap pools' peaks summed."""
    return sum(peak for kind, peak in pools if kind == "HEAP") / 1e6


class JvmStats:
    """Cumulative JVM counters (JIT ms, GC ms and count, classes loaded) and the heap peak."""

    def __init__(self, spark: Any) -> None:
        try:
            self._mf = spark.sparkContext._jvm.java.lang.management.ManagementFactory
        except Exception:
            self._mf = None

    def read(self) -> dict[str, float]:
        if self._mf is None:
            return {}
        try:
            mf = self._mf
            gcs = list(mf.getGarbageCollectorMXBeans())
            pools = [
                (str(p.getType().name()), float(p.getPeakUsage().getUsed()))
                for p in mf.getMemoryPoolMXBeans()
            ]
            return {
                "jit_ms": float(mf.getCompilationMXBean().getTotalCompilationTime()),
                "gc_ms": float(sum(g.getCollectionTime() for g in gcs)),
                "gc_count": float(sum(g.getCollectionCount() for g in gcs)),
                "classes_loaded": float(mf.getClassLoadingMXBean().getTotalLoadedClassCount()),
                "jvm_heap_peak_mb": sum_peaks(pools),
            }
        except Exception:
            return {}

    def reset_peaks(self) -> None:
        if self._mf is None:
            return
        with contextlib.suppress(Exception):
            for pool in self._mf.getMemoryPoolMXBeans():
                pool.resetPeakUsage()


class RunStats:
    """``with RunStats(spark) as stats: <one run>`` then ``stats.figures``: the run's JVM
    counter deltas, heap peak and RSS peaks per process."""

    def __init__(self, spark: Any) -> None:
        self.jvm = JvmStats(spark)
        self.rss = RssPeaks(spark)
        self.figures: dict[str, float] = {}
        self._before: dict[str, float] = {}

    def __enter__(self) -> RunStats:
        self.jvm.reset_peaks()
        self.rss.reset()
        self._before = self.jvm.read()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.figures = {**deltas(self._before, self.jvm.read()), **self.rss.read()}
