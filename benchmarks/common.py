"""Shared plumbing: result documents, machine info, statistics, stores, a Spark session.

Every benchmark returns a :class:`Result`; ``run.py`` stamps it with the machine and the time
and writes ``<out>/<name>.json``. The document shape (also checked by
``tests/integration/test_benchmarks_quick.py`` and described in ``docs/benchmarks.md``)::

    {
      "benchmark": str, "schema_version": 1, "timestamp": ISO-8601 UTC, "quick": bool,
      "duration_s": float,
      "machine": {"cores", "python", "spark", "platform", "load_avg_1m", ...},
      "parameters": {...}, "repetitions": int,
      "cases": [{"name": str, "params": {...}, "samples": {...}, "medians": {...}}],
      "medians": {...}, "ratios": {...},
      "targets": [{"name", "target", "measured", "unit", "pass": bool | None, "note"}],
      "status": "pass" | "miss" | "partial" | "skipped" | "error",
      "notes": [str]
    }
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@dataclass
class Target:
    """One acceptance target and how the measurement compares (``passed`` None: not judged)."""

    name: str
    target: str
    measured: float | str | None
    unit: str = ""
    passed: bool | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "measured": _clean(self.measured),
            "unit": self.unit,
            "pass": self.passed,
            "note": self.note,
        }


@dataclass
class Case:
    """One measured configuration: raw samples (lists) and their medians."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    medians: dict[str, Any] = field(default_factory=dict)

    def add(self, metric: str, value: float) -> None:
        self.samples.setdefault(metric, []).append(value)

    def finalize(self) -> Case:
        for metric, values in self.samples.items():
            if values and metric not in self.medians:
                self.medians[metric] = statistics.median(values)
        return self

    def to_json(self) -> dict[str, Any]:
        self.finalize()
        return {
            "name": self.name,
            "params": _clean(self.params),
            "samples": _clean(self.samples),
            "medians": _clean(self.medians),
        }


@dataclass
class Result:
    benchmark: str
    parameters: dict[str, Any] = field(default_factory=dict)
    repetitions: int = 1
    cases: list[Case] = field(default_factory=list)
    medians: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str | None = None

    def case(self, name: str, **params: Any) -> Case:
        found = Case(name, dict(params))
        self.cases.append(found)
        return found

    def overall_status(self) -> str:
        if self.status is not None:
            return self.status
        judged = [t.passed for t in self.targets if t.passed is not None]
        if not judged:
            return "partial" if self.cases else "skipped"
        return "pass" if all(judged) else "miss"

    def to_json(self, *, quick: bool, duration_s: float) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "schema_version": SCHEMA_VERSION,
            "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "quick": quick,
            "duration_s": round(duration_s, 3),
            "machine": machine_info(),
            "parameters": _clean(self.parameters),
            "repetitions": self.repetitions,
            "cases": [c.to_json() for c in self.cases],
            "medians": _clean(self.medians),
            "ratios": _clean(self.ratios),
            "targets": [t.to_json() for t in self.targets],
            "status": self.overall_status(),
            "notes": list(self.notes),
        }


def _clean(value: Any) -> Any:
    """JSON-safe: floats rounded to 6 significant digits, NaN/inf to None, tuples to lists."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    return str(value)


# ---------------------------------------------------------------------------- machine


def spark_version() -> str:
    try:
        import pyspark

        return str(pyspark.__version__)
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return "(not installed)"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "spark": spark_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
    with contextlib.suppress(OSError):  # not on every platform
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    try:
        with open("/proc/meminfo") as fh:
            first = fh.readline().split()
        info["memory_gb"] = round(int(first[1]) / 1024 / 1024, 1)
    except (OSError, IndexError, ValueError):  # pragma: no cover
        pass
    try:
        import subprocess

        java = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=20, check=False
        )
        info["java"] = (java.stderr or java.stdout).splitlines()[0] if java.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError, IndexError):  # pragma: no cover
        info["java"] = ""
    return info


# ---------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank-interpolated percentile (pct in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * pct / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) over log(x): the growth exponent (1 = linear)."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pairs) < 2:
        return float("nan")
    mx = sum(p[0] for p in pairs) / len(pairs)
    my = sum(p[1] for p in pairs) / len(pairs)
    sxx = sum((p[0] - mx) ** 2 for p in pairs)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pairs)
    return sxy / sxx if sxx else float("nan")


def ratio(ours: float, baseline: float) -> float:
    return ours / baseline if baseline > 0 else float("nan")


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.seconds = time.perf_counter() - self.started


def alternate(
    contenders: Sequence[tuple[str, Callable[[int], dict[str, float]]]], repetitions: int
) -> Iterator[tuple[int, str, dict[str, float]]]:
    """Run each contender once per repetition, alternating which goes first (ABBA...), so
    warm-up and background noise do not favour one side."""
    for rep in range(repetitions):
        order = list(contenders) if rep % 2 == 0 else list(reversed(contenders))
        for name, fn in order:
            yield rep, name, fn(rep)


# ---------------------------------------------------------------------------- stores


def pg_admin_url() -> str:
    return os.environ.get("FINALCKPT_BENCH_PG_URL") or DEFAULT_PG_ADMIN_URL


def postgres_available() -> str | None:
    """None if the admin database answers, else the reason it does not."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    url = make_url(pg_admin_url()).set(drivername="postgresql+psycopg")
    try:
        engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"PostgreSQL not reachable at {url.host}:{url.port or 5432}: {type(exc).__name__}"
    return None


@contextmanager
def postgres_database(prefix: str = "finalckpt_bench") -> Iterator[str]:
    """A freshly created PostgreSQL database (URL), dropped afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    admin = make_url(pg_admin_url()).set(drivername="postgresql+psycopg")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    engine = create_engine(
        admin,
        isolation_level="AUTOCOMMIT",
        poolclass=NullPool,
        connect_args={"connect_timeout": 5},
    )
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


# ---------------------------------------------------------------------------- spark

_SPARK: Any = None


def spark_session() -> Any:
    """One local Spark session for every Spark benchmark of this process (both sides share
    it, so JVM start-up and warm caches favour neither)."""
    global _SPARK
    if _SPARK is None:
        from pyspark.sql import SparkSession

        _SPARK = (
            SparkSession.builder.master(os.environ.get("FINALCKPT_BENCH_SPARK_MASTER", "local[2]"))
            .appName("finalckpt-benchmarks")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        _SPARK.sparkContext.setLogLevel("ERROR")
    return _SPARK


def stop_spark() -> None:
    global _SPARK
    if _SPARK is not None:
        _SPARK.stop()
        _SPARK = None


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit_json(doc: Any, out: Path | None) -> int:
    """A profiling script's output: the document on stdout, and in ``out`` when given; 0."""
    text = json.dumps(doc, indent=1, default=str)
    if out is not None:
        out.write_text(text + "\n")
    print(text)
    return 0
