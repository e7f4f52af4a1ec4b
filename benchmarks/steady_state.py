"""Steady-state overhead: the example pipeline through our runtime vs plain PySpark jobs.

Both contenders (``benchmarks.pipelines``) run the same four transforms on the same input in
this process, on the same SparkSession. Our side uses ``batch_size="auto"`` everywhere (no
hand-picked batch sizes) with the runtime's default target batch duration, and checkpoints
every ``INTERVAL_S`` seconds; nothing fails.

Our side is one DAG that runs repeatedly: its runs of a data set share one throughput-hints
root (``StorageThroughputHints``), as the runs of one DAG share theirs beside the checkpoints.
A new DAG (``ours-cold``) starts from an empty hints root: every stage sizes its first batch
from its input bytes at a conservative default rate (ingest from its day files' declared sizes,
the others from their upstream parts). ``cold_mb_per_s`` / ``warm_mb_per_s``: each stage's input
MB/s in the first batch of ours' first run and in the last warm batch (the evidence behind
``DEFAULT_COLD_BYTES_PER_S``).

Order (``METHOD``): after a one-day warm-up of both sides, each data set first gets one untimed
run of each side (plain, then ours, whose run seeds the hints): the process's first runs at this
size, which pay the JVM's first-use costs (JIT compilation and class loading of the code paths
at this size) whoever runs first (docs/benchmarks.md, "Profile of the first (cold) run"; their
seconds are kept as ``first_run_s/...``, not judged). Then ``REPETITIONS_X1`` (x1) or
``REPETITIONS`` (x10) rounds of plain, ours (warm: the shared hints), ours-cold (a fresh hints
root each time), in ABC CBA order (``rotation``), so a drift over the run weighs every side
alike: the x10 samples of 2026-11-27 04:18 fell 21, 22, 18, 16, 15, 15 s in time order.
Before 2026-11-28 the cold figure was one run, the first on the data set, against plain's later
runs: it carried the JVM's first-use costs that plain's samples did not (x1: 1.36-1.53).

Reported: the median wall time of each side, per stage, ours/plain and cold/plain (whole
pipeline and enrich..publish), the batches per stage and the chosen batch sizes, our time
inside the protocol's own calls (``ProtocolTimer``: coordinator, sink two-phase commit, state
files), and per side the memory peaks and JVM counters of its runs (``process_stats``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import Case, Result, Target, log, median, ratio, spark_session
from benchmarks.pipelines import (
    STAGES,
    Ours,
    cached_inputs,
    hints_for,
    input_mb,
    prepare_inputs,
    remove,
    run_plain,
)
from benchmarks.process_stats import RunStats

NAME = "steady_state_overhead"
#: ``--only overhead_x10``: the full year with every flight ten times (3.4 M flights).
NAME_X10 = "steady_state_overhead_x10"
INTERVAL_S = 10.0
#: Timed runs per side at x10 (even: a balanced rotation; see the module docstring). One x10 run
#: swings ~10 % here (enrich 5.3-6.7 s in one run of 2026-11-28): 6, not 4, so one slow sample
#: does not decide a 5 % bound (~1 min more).
REPETITIONS = 6
#: At x1 a run is ~4-10 s and one run swings 0.3-0.5 s (two quiet runs of 4 read the cold
#: ratio 1.11 and 1.18): twice the samples there, for ~1-2 min more.
REPETITIONS_X1 = 8
TARGET_RATIO = 1.10
#: Targets at x10 (issue 12) and x100 (issue 29): enrich..publish and the whole pipeline <= 1.05.
TARGET_RATIO_LARGE = 1.05
#: Issue 29: the DAG's first run (no hints) <= 1.15 at x1, <= 1.10 at x10 (medians).
COLD_TARGET = 1.15
COLD_TARGET_LARGE = 1.10
DOWNSTREAM = ("enrich", "delay_windows", "publish")
DOWNSTREAM_SECONDS = tuple(f"{stage}_s" for stage in DOWNSTREAM)
SIDE_NAMES = {
    "plain": "plain",
    "ours": "ours (warm: hints of earlier runs)",
    "ours-cold": "ours, first run of a new DAG (no hints)",
}
METHOD = (
    "one-day warm-up of both sides; per data set one untimed first run of plain and of ours "
    "(seeds the hints); then per repetition plain, ours, ours-cold in ABC CBA order"
)
METHOD_NO_COLD = (
    "one-day warm-up of both sides; per data set one untimed first run of ours (seeds the "
    "hints); then ABBA over an even number of repetitions"
)
MEMORY_KEYS = ("peak_rss_mb_total", "peak_rss_mb_python", "peak_rss_mb_jvm", "jvm_heap_peak_mb")


def warm_up(spark: object, tmp: Path) -> None:
    """One untimed run of each side on one day: JIT, class loading, Python imports."""
    inputs = prepare_inputs(tmp / "warm-input", days=1)
    run_plain(spark, inputs, tmp / "warm-plain")
    ours = Ours(spark, inputs, tmp / "warm-ours")
    ours.run()
    ours.close()
    remove(tmp / "warm-plain")
    remove(tmp / "warm-ours")


def _ours_sample(case: Any, ours: Ours, run: Any) -> None:
    case.add("seconds", run.seconds)
    case.add("output_rows", float(ours.output_rows()))
    completed = [c for c in ours.coordinator.checkpoints() if c.is_completed]
    case.add("checkpoints_completed", float(len(completed)))
    for stage, secs in run.stage_seconds().items():
        case.add(f"{stage}_s", secs)
    for stage in STAGES:
        sizes = ours.batches.get(stage, [])
        case.add(f"batches_{stage}", float(len(sizes)))
        seconds = ours.batch_seconds.get(stage, [])
        if seconds:
            case.add(f"max_batch_s_{stage}", max(seconds))
    case.params.setdefault("batch_sizes", []).append(
        {stage: ours.batches.get(stage, []) for stage in STAGES}
    )
    for category, secs in run.protocol.items():
        case.add(f"protocol_{category}_s", secs)
    case.add("protocol_s", sum(run.protocol.values()))


def _rates(result: Result, prefix: str, hints: Any, first: bool = False) -> None:
    """Per stage, the input MB/s of a batch the hints hold (weights in bytes): the evidence
    behind ``DEFAULT_COLD_BYTES_PER_S`` (``first``: the cold run's first batch; else the last
    warm one) and its input MB."""
    for stage in STAGES:
        hint = hints.load(stage)
        if hint is not None and hint.by_bytes and hint.samples:
            last = hint.samples[0 if first else -1]
            result.medians[f"{prefix}/{stage}"] = last.weight / max(last.seconds, 1e-9) / 1e6
            result.medians[f"{prefix.replace('mb_per_s', 'input_mb')}/{stage}"] = last.weight / 1e6


def _downstream(medians: dict[str, Any]) -> float:
    return sum(medians.get(key, 0.0) for key in DOWNSTREAM_SECONDS)


def rotation(rep: int, sides: Sequence[str]) -> list[str]:
    """The sides' order in repetition ``rep``: as given on even ones, reversed on odd ones
    (ABC CBA ...), so over an even number of repetitions every side's mean position is the
    same and a drift over the run weighs all alike."""
    return list(sides) if rep % 2 == 0 else list(reversed(sides))


def _plain_sample(case: Any, got: Any) -> None:
    case.add("seconds", got.seconds)
    case.add("output_rows", float(got.output_rows or 0))
    for stage, secs in got.stage_seconds().items():
        case.add(f"{stage}_s", secs)


def _one_run(spark: Any, side: str, inputs: str, where: Path, hints: Any, case: Any) -> float:
    """One run of ``side`` (``plain``, or ours with ``hints``) into ``case``, with its memory
    peaks and JVM counters (``process_stats``); returns its seconds."""
    with RunStats(spark) as stats:
        if side == "plain":
            got = run_plain(spark, inputs, where)
        else:
            ours = Ours(spark, inputs, where, checkpoint_interval_s=INTERVAL_S, hints=hints)
            got = ours.run()
    if side == "plain":
        _plain_sample(case, got)
    else:
        _ours_sample(case, ours, got)
        ours.close()
    for key, value in stats.figures.items():
        case.add(key, value)
    remove(where)
    return float(got.seconds)


def run(
    quick: bool = False,
    datasets: list[tuple[int, int]] | None = None,
    name: str = NAME,
    repetitions: int | None = None,
    *,
    cold_samples: bool = True,
    cached: bool = False,
    hints_root: Path | None = None,
) -> Result:
    """``datasets``: (days, row scale) pairs; default 2 days (quick) or 365 days at x1.
    ``cold_samples``: time first runs of a new pipeline key (no hints) in the rotation (the
    cold target); else only the steady state. ``cached``: inputs from ``cached_inputs``.
    ``hints_root``: where the hints of our runs live (kept after the run; default: a
    temporary directory)."""
    sets = datasets or ([(2, 1)] if quick else [(365, 1)])
    reps = repetitions or (1 if quick else REPETITIONS_X1)
    sides = ("plain", "ours", "ours-cold") if cold_samples else ("plain", "ours")
    result = Result(name, repetitions=reps)
    result.parameters = {
        "datasets": [{"days": d, "row_scale": s} for d, s in sets],
        "checkpoint_interval_s": INTERVAL_S,
        "batch_size": "auto (every stage; the runtime's default target_batch_s)",
        "hints": "one throughput-hints root per data set, shared by all our warm runs of it "
        "(the runs of one DAG), seeded by ours' first run on the data set; every ours-cold "
        "run starts from a fresh, empty hints root (a new DAG)",
        "order": METHOD if cold_samples else METHOD_NO_COLD,
        "store": "SQLite coordination store, local checkpoint storage and sinks",
        "plain": "one Spark job per stage with the same transforms, same outputs "
        "(Parquet directory + SQL table)",
        "memory": "per run: peak RSS of this Python process, the driver JVM and its children "
        "(VmHWM, reset before each run) and the JVM's peak used heap (process_stats)",
    }
    spark = spark_session()
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-steady-") as tmp_name:
        tmp = Path(tmp_name)
        if not quick:
            log(f"{name}: warm-up")
            warm_up(spark, tmp)
        for days, scale in sets:
            label = f"{days}d" + (f"x{scale}" if scale > 1 else "")
            log(f"{name}: preparing {label}")
            if cached:
                inputs = cached_inputs(days, scale)
            else:
                inputs = prepare_inputs(tmp / f"input-{label}", days=days, scale=scale)
            result.parameters.setdefault("input_mb", {})[label] = input_mb(inputs)
            hints = hints_for((hints_root or tmp) / f"hints-{label}")
            cases = {
                side: result.case(
                    f"{side}/{label}", side=SIDE_NAMES[side], days=days, row_scale=scale
                )
                for side in sides
            }
            for side in ("plain", "ours") if cold_samples else ("ours",):
                log(f"{name}: {label} first run of {side} on this data set (not judged)")
                where = tmp / f"first-{side}-{label}"
                seconds = _one_run(spark, side, inputs, where, hints, Case(f"first-{side}"))
                result.medians[f"first_run_s/{label}/{side}"] = seconds
            _rates(result, f"cold_mb_per_s/{label}", hints, first=True)
            for rep in range(reps):
                for side in rotation(rep, sides):
                    log(f"{name}: {label} repetition {rep + 1}/{reps}: {side}")
                    where = tmp / f"{side}-{label}-{rep}"
                    use = hints
                    if side == "ours-cold":  # a new DAG: a fresh, empty hints root
                        use = hints_for(tmp / f"hints-cold-{label}-{rep}")
                    _one_run(spark, side, inputs, where, use, cases[side])
            _rates(result, f"warm_mb_per_s/{label}", hints)
            for case in cases.values():
                case.finalize()
            rows = {c.name: c.medians["output_rows"] for c in cases.values()}
            if len(set(rows.values())) != 1:
                result.notes.append(f"{label}: output row counts differ: {rows}")
            _memory(result, label, cases)
            _report(result, label, scale, reps, cases)
    return result


def _memory(result: Result, label: str, cases: dict[str, Any]) -> None:
    """Per side, the highest memory peaks over its runs (MB)."""
    for side, case in cases.items():
        for key in MEMORY_KEYS:
            if case.samples.get(key):
                result.medians[f"memory/{label}/{side}/{key}_max"] = max(case.samples[key])


def _report(result: Result, label: str, scale: int, reps: int, cases: dict[str, Any]) -> None:
    large = scale >= 10
    target = TARGET_RATIO_LARGE if large else TARGET_RATIO
    plain, ours, cold = cases["plain"], cases["ours"], cases.get("ours-cold")
    value = _stage_ratios(result, "ours_over_plain", label, ours, plain)
    for stage in STAGES:
        result.medians[f"batches/{label}/{stage}"] = ours.medians.get(f"batches_{stage}", 0.0)
    protocol_s = ours.medians["protocol_s"]
    result.medians[f"protocol_s/{label}"] = protocol_s
    result.ratios[f"protocol_over_plain/{label}"] = ratio(protocol_s, plain.medians["seconds"])
    result.medians[f"plain_s/{label}"] = plain.medians["seconds"]
    result.medians[f"ours_s/{label}"] = ours.medians["seconds"]
    paired = _paired(ours, plain, ("seconds",))
    result.medians[f"paired_ratio_median/{label}"] = median(paired)
    ours_down, plain_down = _downstream(ours.medians), _downstream(plain.medians)
    down_ratio = ratio(ours_down, plain_down)
    result.ratios[f"ours_over_plain/{label}/after_ingest"] = down_ratio
    # Shown, not judged: the runs of one repetition are neighbours in time, and the machine's
    # drift moves them together (docs/benchmarks.md), which their ratio cancels.
    paired_down = _paired(ours, plain, DOWNSTREAM_SECONDS)
    result.medians[f"paired_ratio_median/{label}/after_ingest"] = median(paired_down)
    result.targets.append(
        Target(
            name=f"steady state, enrich..publish ours/plain, {label}",
            target=f"<= {target:.2f}",
            measured=down_ratio,
            passed=bool(down_ratio <= target),
            note=f"medians of {reps}, hints from earlier runs: ours {ours_down:.2f} s, "
            f"plain {plain_down:.2f} s; paired {[round(r, 3) for r in paired_down]}",
        )
    )
    result.targets.append(
        Target(
            name=f"steady state, whole pipeline ours/plain, {label}",
            target=f"<= {target:.2f}",
            measured=value,
            passed=bool(value <= target),
            note=f"medians of {reps}: ours {ours.medians['seconds']:.1f} s, "
            f"plain {plain.medians['seconds']:.1f} s; paired {paired}",
        )
    )
    if cold is not None:
        _report_cold(result, label, large, reps, plain, cold)


def _paired(side: Any, plain: Any, metrics: Sequence[str]) -> list[float]:
    """Per repetition, the sum of ``metrics`` of ``side``'s run over that of plain's."""

    def per_run(case: Any) -> list[float]:
        return [sum(run) for run in zip(*(case.samples[m] for m in metrics), strict=True)]

    return [ratio(o, p) for o, p in zip(per_run(side), per_run(plain), strict=True)]


def _stage_ratios(result: Result, prefix: str, label: str, side: Any, plain: Any) -> float:
    """``<prefix>/<label>`` (whole run) and ``<prefix>/<label>/<stage>`` of ``side`` over plain;
    returns the whole run's."""
    value = ratio(side.medians["seconds"], plain.medians["seconds"])
    result.ratios[f"{prefix}/{label}"] = value
    for stage in STAGES:
        key = f"{stage}_s"
        if key in side.medians and key in plain.medians:
            result.ratios[f"{prefix}/{label}/{stage}"] = ratio(
                side.medians[key], plain.medians[key]
            )
    return value


def _report_cold(result: Result, label: str, large: bool, reps: int, plain: Any, cold: Any) -> None:
    _stage_ratios(result, "cold_over_plain", label, cold, plain)
    for stage in STAGES:
        result.medians[f"cold_batches/{label}/{stage}"] = cold.medians.get(f"batches_{stage}", 0.0)
    result.medians[f"cold_s/{label}"] = cold.medians["seconds"]
    cold_down, plain_down = _downstream(cold.medians), _downstream(plain.medians)
    cold_ratio = ratio(cold_down, plain_down)
    result.ratios[f"cold_over_plain/{label}/after_ingest"] = cold_ratio
    cold_target = COLD_TARGET_LARGE if large else COLD_TARGET
    result.targets.append(
        Target(
            name=f"first (cold) run, enrich..publish ours/plain, {label}",
            target=f"<= {cold_target:.2f}",
            measured=cold_ratio,
            passed=bool(cold_ratio <= cold_target),
            note=f"medians of {reps} first runs of a new DAG (fresh hints root) in the rotation: "
            f"cold ours {cold_down:.2f} s vs plain {plain_down:.2f} s; whole pipeline "
            f"{cold.medians['seconds']:.1f} s vs {plain.medians['seconds']:.1f} s",
        )
    )


def run_x10(quick: bool = False) -> Result:
    """The full year with every flight ten times (3.4 M flights): ``--only overhead_x10``.
    Quick mode: 2 days x10, one repetition."""
    sets = [(2, 10)] if quick else [(365, 10)]
    return run(quick, datasets=sets, name=NAME_X10, repetitions=None if quick else REPETITIONS)
