"""Why the first (cold) run of the steady-state benchmark looked dear: a profile (issue 29).

One process, one SparkSession, after the steady-state benchmark's one-day warm-up, the full
year at ``--scale``; then, in this order (``--first`` picks which side opens)::

    first run of side X, first run of side Y,
    then twice: plain, ours warm (hints of the earlier ours run), ours cold (a fresh hints root)

"ours cold" = a pipeline key with no hints (fresh store, checkpoints and hints root, the
state a new DAG starts in), "ours warm" = the same data with the hints of an earlier run.
Every run reports its wall time and stages, the JVM's JIT milliseconds, GC milliseconds and
classes loaded during it (``process_stats``), and the Python side's profile (cProfile over the
run, both sides alike): the seconds inside py4j calls and, for ours, the product functions
whose cumulative time differs most between the cold runs and the warm ones.

``python -m benchmarks.cold_profile [--days 365 --scale 1 --first plain|ours --out FILE]``.
Numbers and reading: docs/benchmarks.md, section "Profile of the first (cold) run".
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import emit_json, log, spark_session, stop_spark
from benchmarks.pipelines import Ours, hints_for, prepare_inputs, remove, run_plain
from benchmarks.process_stats import RunStats
from benchmarks.steady_state import warm_up

PY4J_CALLS = ("clientserver.py", "java_gateway.py")


def sequence(first: str) -> list[str]:
    """The runs in order: both sides' first runs (``first`` opens), then two rounds of plain,
    ours warm, ours cold."""
    other = "ours-cold" if first == "plain" else "plain"
    opener = "ours-cold" if first == "ours" else "plain"
    return [opener, other, "plain", "ours-warm", "ours-cold", "plain", "ours-warm", "ours-cold"]


def py_profile(profiler: cProfile.Profile) -> tuple[float, dict[str, float]]:
    """Seconds inside py4j's send calls, and cumulative seconds per product function."""
    stats = pstats.Stats(profiler)
    py4j = 0.0
    product: dict[str, float] = {}
    for (filename, line, func), row in stats.stats.items():  # type: ignore[attr-defined]
        cumulative = row[3]
        if filename.endswith(PY4J_CALLS) and func == "send_command":
            py4j = max(py4j, cumulative)
        if "airflow_finalckpt" in filename:
            short = filename.split("airflow_finalckpt/")[-1]
            product[f"{short}:{line}({func})"] = cumulative
    return py4j, product


def differences(
    cold: list[dict[str, float]], warm: list[dict[str, float]], top: int
) -> list[dict[str, Any]]:
    """Product functions by how much more cumulative time the cold runs spent in them than the
    warm runs (means over the runs of each kind)."""

    def mean(runs: list[dict[str, float]], key: str) -> float:
        return sum(r.get(key, 0.0) for r in runs) / max(len(runs), 1)

    keys = {k for r in [*cold, *warm] for k in r}
    rows = [(mean(cold, k) - mean(warm, k), mean(cold, k), mean(warm, k), k) for k in keys]
    rows.sort(reverse=True)
    return [
        {"function": k, "cold_s": round(c, 3), "warm_s": round(w, 3), "extra_s": round(d, 3)}
        for d, c, w, k in rows[:top]
    ]


def profile(days: int, scale: int, first: str, top: int) -> dict[str, Any]:
    spark = spark_session()
    doc: dict[str, Any] = {"days": days, "row_scale": scale, "first": first, "runs": []}
    product_runs: dict[str, list[dict[str, float]]] = {"ours-cold": [], "ours-warm": []}
    with tempfile.TemporaryDirectory(prefix="finalckpt-cold-profile-") as tmp_name:
        tmp = Path(tmp_name)
        log("warm-up (one day, both sides)")
        warm_up(spark, tmp)
        inputs = prepare_inputs(tmp / "input", days=days, scale=scale)
        warm_hints = None
        for index, kind in enumerate(sequence(first)):
            log(f"run {index}: {kind}")
            where = tmp / f"run-{index}"
            profiler = cProfile.Profile()
            ours = None
            if kind != "plain":
                hints = hints_for(tmp / f"hints-{index}") if kind == "ours-cold" else warm_hints
                ours = Ours(spark, inputs, where, hints=hints)
                warm_hints = warm_hints or hints
            with RunStats(spark) as stats:
                profiler.enable()
                got = ours.run() if ours is not None else run_plain(spark, inputs, where)
                profiler.disable()
            py4j_s, product = py_profile(profiler)
            row = {
                "index": index,
                "kind": kind,
                "seconds": round(got.seconds, 3),
                "stages_s": {k: round(v, 3) for k, v in got.stage_seconds().items()},
                "py4j_s": round(py4j_s, 3),
                **{k: round(v, 3) for k, v in stats.figures.items()},
            }
            if ours is not None:
                row["batches"] = {k: len(v) for k, v in ours.batches.items()}
                row["protocol_s"] = round(sum(got.protocol.values()), 3)
                product_runs[kind].append(product)
                ours.close()
            doc["runs"].append(row)
            log(json.dumps(row))
            remove(where)
    cold = product_runs["ours-cold"][1:]  # the ones after the warm-up of this data set
    doc["cold_minus_warm"] = differences(cold, product_runs["ours-warm"], top)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_profile")
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--first", choices=("plain", "ours"), default="plain")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from benchmarks.run import _quiet_logs

    _quiet_logs()
    try:
        doc = profile(args.days, args.scale, args.first, args.top)
    finally:
        stop_spark()
    return emit_json(doc, args.out)


if __name__ == "__main__":
    sys.exit(main())
