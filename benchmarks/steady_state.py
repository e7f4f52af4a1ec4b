"""Steady-state overhead: the example pipeline through our runtime vs plain PySpark jobs.

Both contenders (``benchmarks.pipelines``) run the same four transforms on the same input in
this process, on the same SparkSession, alternating (ABBA) over the repetitions after one
untimed warm-up of each on a tiny input. Ours checkpoints every ``INTERVAL_S`` seconds and uses
about six split batches per stage (``default_batch_sizes``); nothing fails. Reported: the
median wall time of each side, per stage, and ours/plain, with our overhead split into the
protocol's own calls (``ProtocolTimer``: coordinator, sink two-phase commit, state files) and
the rest (running the transforms per split batch instead of once per stage).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Result, Target, log, median, ratio, spark_session
from benchmarks.pipelines import (
    STAGES,
    Ours,
    default_batch_sizes,
    prepare_inputs,
    remove,
    run_plain,
)

NAME = "steady_state_overhead"
INTERVAL_S = 10.0
TARGET_RATIO = 1.10


def warm_up(spark: object, tmp: Path) -> None:
    """One untimed run of each side on one day: JIT, class loading, Python imports."""
    inputs = prepare_inputs(tmp / "warm-input", days=1)
    run_plain(spark, inputs, tmp / "warm-plain")
    ours = Ours(spark, inputs, tmp / "warm-ours", batch_sizes=default_batch_sizes(1))
    ours.run()
    ours.close()
    remove(tmp / "warm-plain")
    remove(tmp / "warm-ours")


def run(quick: bool = False, datasets: list[tuple[int, int]] | None = None) -> Result:
    """``datasets``: (days, row scale) pairs; default 5 days (quick) or 365 days."""
    sets = datasets or ([(2, 1)] if quick else [(365, 1)])
    repetitions = 1 if quick else 3
    result = Result(NAME, repetitions=repetitions)
    result.parameters = {
        "datasets": [{"days": d, "row_scale": s} for d, s in sets],
        "checkpoint_interval_s": INTERVAL_S,
        "batch_sizes": {f"{d}x{s}": default_batch_sizes(d) for d, s in sets},
        "order": "alternating, ABBA over repetitions, after one untimed warm-up of each",
        "store": "SQLite coordination store, local checkpoint storage and sinks",
        "plain": "one Spark job per stage with the same transforms, same outputs "
        "(Parquet directory + SQL table)",
    }
    spark = spark_session()
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-steady-") as tmp_name:
        tmp = Path(tmp_name)
        if not quick:
            log(f"{NAME}: warm-up")
            warm_up(spark, tmp)
        for days, scale in sets:
            label = f"{days}d" + (f"x{scale}" if scale > 1 else "")
            inputs = prepare_inputs(tmp / f"input-{label}", days=days, scale=scale)
            plain_case = result.case(f"plain/{label}", side="plain", days=days, row_scale=scale)
            ours_case = result.case(f"ours/{label}", side="ours", days=days, row_scale=scale)
            for rep in range(repetitions):
                order = ("plain", "ours") if rep % 2 == 0 else ("ours", "plain")
                for side in order:
                    log(f"{NAME}: {label} repetition {rep + 1}/{repetitions}: {side}")
                    where = tmp / f"{side}-{label}-{rep}"
                    if side == "plain":
                        run = run_plain(spark, inputs, where)
                        plain_case.add("seconds", run.seconds)
                        plain_case.add("output_rows", float(run.output_rows or 0))
                        for stage, secs in run.stage_seconds().items():
                            plain_case.add(f"{stage}_s", secs)
                    else:
                        ours = Ours(
                            spark,
                            inputs,
                            where,
                            batch_sizes=default_batch_sizes(days),
                            checkpoint_interval_s=INTERVAL_S,
                        )
                        run = ours.run()
                        ours_case.add("seconds", run.seconds)
                        ours_case.add("output_rows", float(ours.output_rows()))
                        completed = [c for c in ours.coordinator.checkpoints() if c.is_completed]
                        ours_case.add("checkpoints_completed", float(len(completed)))
                        for stage, secs in run.stage_seconds().items():
                            ours_case.add(f"{stage}_s", secs)
                        for category, secs in run.protocol.items():
                            ours_case.add(f"protocol_{category}_s", secs)
                        ours_case.add("protocol_s", sum(run.protocol.values()))
                        ours.close()
                    remove(where)
            plain_case.finalize()
            ours_case.finalize()
            if plain_case.medians["output_rows"] != ours_case.medians["output_rows"]:
                result.notes.append(
                    f"{label}: output row counts differ (plain "
                    f"{plain_case.medians['output_rows']:.0f}, ours "
                    f"{ours_case.medians['output_rows']:.0f})"
                )
            value = ratio(ours_case.medians["seconds"], plain_case.medians["seconds"])
            result.ratios[f"ours_over_plain/{label}"] = value
            for stage in STAGES:
                key = f"{stage}_s"
                if key in ours_case.medians and key in plain_case.medians:
                    result.ratios[f"ours_over_plain/{label}/{stage}"] = ratio(
                        ours_case.medians[key], plain_case.medians[key]
                    )
            protocol_s = ours_case.medians["protocol_s"]
            result.medians[f"protocol_s/{label}"] = protocol_s
            # The protocol's own calls (coordinator, sink 2PC, state files) as a share of the
            # plain run; the rest of any difference is Spark work done per split batch.
            result.ratios[f"protocol_over_plain/{label}"] = ratio(
                protocol_s, plain_case.medians["seconds"]
            )
            result.medians[f"plain_s/{label}"] = plain_case.medians["seconds"]
            result.medians[f"ours_s/{label}"] = ours_case.medians["seconds"]
            paired = [
                ratio(o, p)
                for o, p in zip(
                    ours_case.samples["seconds"], plain_case.samples["seconds"], strict=True
                )
            ]
            result.medians[f"paired_ratio_median/{label}"] = median(paired)
            downstream = ("enrich", "delay_windows", "publish")
            ours_down = sum(ours_case.medians[f"{s}_s"] for s in downstream)
            plain_down = sum(plain_case.medians[f"{s}_s"] for s in downstream)
            down_ratio = ratio(ours_down, plain_down)
            result.ratios[f"ours_over_plain/{label}/after_ingest"] = down_ratio
            result.targets.append(
                Target(
                    name=f"wall time ours/plain after ingest (enrich..publish), {label}",
                    target=f"<= {TARGET_RATIO:.2f}",
                    measured=down_ratio,
                    passed=bool(down_ratio <= TARGET_RATIO),
                    note=f"ours {ours_down:.1f} s, plain {plain_down:.1f} s: the stages "
                    "whose input is already there, without ingest's file-listing cost",
                )
            )
            result.targets.append(
                Target(
                    name=f"wall time ours/plain, {label}",
                    target=f"<= {TARGET_RATIO:.2f}",
                    measured=value,
                    passed=bool(value <= TARGET_RATIO),
                    note=f"medians of {repetitions}: ours {ours_case.medians['seconds']:.1f} s, "
                    f"plain {plain_case.medians['seconds']:.1f} s",
                )
            )
    return result
