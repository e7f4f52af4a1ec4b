"""Where our run's time goes, per stage and per split batch (not part of the suite).

One warm run of our side (``batch_size="auto"``, hints seeded by an untimed run on the same data,
like the steady-state benchmark), timed by phase, next to a plain run of the same transforms:

* per batch: ``process`` (the transform and its Spark write: ``before-batch`` -> ``mid-batch``,
  of which ``persist_state``: keyed state written), ``precommit`` + ``record_batch`` (sink
  pre-commit, the coordinator transition: ``mid-batch`` -> ``after-record-batch``);
* per stage: the rest of the stage's wall time (attempt start, restore, ``finish()``: the
  windows' flush, the final checkpoint and close wait);
* Spark jobs started per stage (``statusTracker``), Parquet writes and their seconds.

``python -m benchmarks.profile_batches [--days 48 --scale 10 --out FILE]`` prints JSON (the
numbers are in docs/benchmarks.md, section "Profile").
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, log, spark_session
from benchmarks.pipelines import STAGES, Ours, hints_for, prepare_inputs, remove, run_plain


class PhaseClock:
    """Times the runtime's fault points and wrapped calls of one run, per stage."""

    def __init__(self, spark: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.stage: str | None = None
        self.marks: dict[str, float] = {}
        self.per_stage: dict[str, dict[str, float]] = {}
        self.batches: dict[str, list[dict[str, float]]] = {}

    def jobs(self) -> int:
        return len(self.tracker.getJobIdsForGroup())

    def add(self, key: str, seconds: float, stage: str | None = None) -> None:
        where = stage or self.stage or "-"
        bucket = self.per_stage.setdefault(where, {})
        bucket[key] = bucket.get(key, 0.0) + seconds

    def hook(self, stage_id: str, point: str) -> None:
        now = time.perf_counter()
        if stage_id != self.stage:
            self.stage = stage_id
            self.marks = {"stage": now}
            self.add("jobs_at_start", float(self.jobs()), stage_id)
        if point == "before-batch":
            self.marks["batch"] = now
            self.marks["jobs"] = float(self.jobs())
        elif point == "mid-batch":
            self.marks["mid"] = now
        elif point == "after-record-batch" and "batch" in self.marks:
            self.batches.setdefault(stage_id, []).append(
                {
                    "process_s": self.marks["mid"] - self.marks["batch"],
                    "commit_record_s": now - self.marks["mid"],
                    "spark_jobs": self.jobs() - self.marks["jobs"],
                }
            )

    def wrap(self, owner: Any, name: str, key: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(f"{key}_s", time.perf_counter() - started)
                self.add(f"{key}_calls", 1.0)

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)


def profile(days: int, scale: int, target_s: float | None, top: int) -> dict[str, Any]:
    from pyspark.sql.readwriter import DataFrameReader, DataFrameWriter

    from airflow_finalckpt.spark.stage import SparkStageLogic

    spark = spark_session()
    doc: dict[str, Any] = {"days": days, "row_scale": scale, "target_batch_s": target_s}
    with tempfile.TemporaryDirectory(prefix="finalckpt-profile-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = prepare_inputs(tmp / "input", days=days, scale=scale)
        hints = hints_for(tmp / "hints")
        log("untimed seeding run of ours, untimed plain run")
        seed = Ours(spark, inputs, tmp / "seed", hints=hints, target_batch_s=target_s)
        seed.run()
        seed.close()
        run_plain(spark, inputs, tmp / "plain-0")
        log("plain run")
        plain = run_plain(spark, inputs, tmp / "plain-1")
        doc["plain_stage_s"] = plain.stage_seconds()
        doc["plain_s"] = plain.seconds
        log("profiled run of ours")
        clock = PhaseClock(spark)
        undo = [
            clock.wrap(DataFrameWriter, "parquet", "parquet_write"),
            clock.wrap(DataFrameReader, "parquet", "parquet_read"),
            clock.wrap(SparkStageLogic, "persist_state", "persist_state"),
            clock.wrap(SparkStageLogic, "restore", "restore"),
            clock.wrap(SparkStageLogic, "finish", "finish"),
        ]
        ours = Ours(spark, inputs, tmp / "ours", hints=hints, target_batch_s=target_s)
        profiler = cProfile.Profile()
        try:
            profiler.enable()
            got = ours.run(fault=clock.hook)
            profiler.disable()
        finally:
            for restore in undo:
                restore()
        jobs_end = float(clock.jobs())
        ours.close()
        stage_s = got.stage_seconds()
        doc["ours_s"] = got.seconds
        doc["ours_stage_s"] = stage_s
        doc["protocol_s"] = got.protocol
        doc["batches"] = clock.batches
        doc["batch_sizes"] = ours.batches
        starts = [clock.per_stage.get(s, {}).get("jobs_at_start", jobs_end) for s in STAGES]
        for i, stage in enumerate(STAGES):
            bucket = clock.per_stage.setdefault(stage, {})
            bucket["spark_jobs"] = (starts[i + 1] if i + 1 < len(STAGES) else jobs_end) - starts[i]
            in_batches = sum(b["process_s"] + b["commit_record_s"] for b in clock.batches[stage])
            bucket["outside_batches_s"] = stage_s.get(stage, 0.0) - in_batches
        doc["per_stage"] = clock.per_stage
        stats = pstats.Stats(profiler)
        rows = []
        for (filename, line, func), (_, ncalls, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
            if "airflow_finalckpt" in filename or "readwriter" in filename:
                short = filename.split("site-packages/")[-1].split("/work/main/")[-1]
                rows.append((cumulative, ncalls, f"{short}:{line}({func})"))
        rows.sort(reverse=True)
        doc["cprofile_top"] = [
            {"cumulative_s": round(c, 3), "calls": n, "function": f} for c, n, f in rows[:top]
        ]
        remove(tmp / "ours")
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_batches")
    parser.add_argument("--days", type=int, default=48)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--target-batch-s", type=float, default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    doc = profile(args.days, args.scale, args.target_batch_s, args.top)
    return emit_json(doc, args.out)


if __name__ == "__main__":
    sys.exit(main())
