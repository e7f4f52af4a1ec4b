"""Resume savings: a crash at 25/50/75 % of ``enrich``, then recovery, three ways.

Our side: the example pipeline runs through our runtime until ``enrich`` crashes in the middle of
a split batch (the batch was computed but not recorded: its work is lost, like a SIGKILL); a new
attempt on the same coordination store then resumes: ``ingest`` is closed (no Spark job),
``enrich`` processes only its unfinished splits, ``delay_windows`` and ``publish`` run.

Baselines (plain PySpark jobs, ``benchmarks.pipelines.run_plain``):

* ``retry``: Airflow retries the failed plain ``enrich`` task, which redoes the whole stage, then
  the downstream tasks run;
* ``rerun``: the whole DAG runs again (ingest included);
* ``ideal``: only the unfinished work: a plain ``enrich`` job over exactly the days that were
  not finished at the crash, plus the downstream jobs (their time is taken from the retry run,
  which processes the same full data downstream).

Recovery time is measured from the restart to the end of ``publish`` (the work before the crash
is lost for every side alike and not counted). To pay ``ingest`` only once per side, our crash
runs all start from a copy of one store in which ``ingest`` is closed and ``enrich`` has not
started; the plain ``retry``/``ideal`` jobs read one plain ``ingest`` output.

Data: the full year at x10 rows (3.4 M flights), as the steady-state x10 benchmark. Our side
uses ``batch_size="auto"`` everywhere; ``enrich``, the stage that crashes, has a target batch
duration of ``ENRICH_TARGET_BATCH_S`` (smaller than the runtime's 30 s default, so that it runs
in about four batches on this data and a crash point means something: what a DAG author who
wants a crash to cost at most a few seconds of that stage would set); the other stages keep the
default. One throughput-hints root is seeded by an untimed warm-up run on the same data (the
DAG's earlier runs). The crash is placed by split progress, through the runtime's fault hook:
the first enrich batch computed after the recorded finished splits reached the crash point
(``finished >= point x splits``) is lost (the hook raises at ``mid-batch``, after the batch's
work and before it is recorded). So the crash lands at the claimed fraction or above it by less
than the batch that crossed it (issue 29: before, a batch running across the point crashed, and
2 of 3 crashes "at 25 %" fell at 0 % finished). If that batch was enrich's last, nothing is
left to lose: the crash comes before enrich finishes (100 % finished). Every repetition reports
the fraction it reached, the batch it lost and whether it is within one batch of the point;
the ideal is computed for the days actually unfinished in each sample.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import Result, Target, log, median, ratio, spark_session
from benchmarks.pipelines import Ours, hints_for, prepare_inputs, remove, run_plain

NAME = "resume_savings"
CRASH_POINTS = (0.25, 0.5, 0.75)
#: The quick (CI smoke) mode checks one crash point only.
QUICK_CRASH_POINTS = (0.5,)
TARGET_FACTOR = 1.10
#: The "few seconds" of the target ours <= 1.10 x ideal + constant (issue 12: 3 s): resuming
#: pays a fixed cost (new attempts, the final checkpoints of the resumed stages).
TARGET_CONSTANT_S = 3.0
#: enrich's auto batches' target duration here (the runtime's default is 30 s; see the module
#: doc): plain enrich takes ~9 s on this data and this machine, so about four batches of two
#: splits.
ENRICH_TARGET_BATCH_S = 3.0
#: Quick mode: tiny batches (one split each), so 2 days still give 2 enrich batches.
QUICK_TARGET_BATCH_S = 0.01
#: ``ingest`` writes one part per batch and enrich's splits are those parts: ingest takes
#: fixed batches (days / ENRICH_SPLITS) so that enrich has enough splits for the crash points to
#: fall near 25 / 50 / 75 % (with auto batches ingest makes one part of the whole year).
ENRICH_SPLITS = 8
DOWNSTREAM = ("enrich", "delay_windows", "publish")


class InjectedCrash(RuntimeError):
    """The benchmark's crash in the middle of an enrich batch."""


def plan(quick: bool) -> dict[str, Any]:
    """Days, row scale and enrich's auto batches' target duration.

    The full run uses the whole year with every flight ten times (``row_scale``: 3.4 M flights,
    the issue's x10) so a split batch holds real work next to Spark's fixed cost per job;
    ``FINALCKPT_BENCH_RESUME_SCALE`` / ``FINALCKPT_BENCH_RESUME_DAYS`` change that, and
    ``FINALCKPT_BENCH_RESUME_TARGET_S`` enrich's target batch duration (0.01: one split per
    batch, so a small run still crashes at every point).
    """
    if quick:
        return {
            "days": 2,
            "row_scale": 1,
            "target_batch_s": {"enrich": QUICK_TARGET_BATCH_S},
            "ingest_batch_size": 1,
        }
    scale = int(os.environ.get("FINALCKPT_BENCH_RESUME_SCALE", "10"))
    days = int(os.environ.get("FINALCKPT_BENCH_RESUME_DAYS", "365"))
    return {
        "days": days,
        "row_scale": scale,
        "target_batch_s": {
            "enrich": float(
                os.environ.get("FINALCKPT_BENCH_RESUME_TARGET_S", ENRICH_TARGET_BATCH_S)
            )
        },
        "ingest_batch_size": -(-days // ENRICH_SPLITS),
    }


def make_template(
    spark: Any,
    inputs: str,
    root: Path,
    batch_sizes: dict[str, Any] | None = None,
    *,
    target_batch_s: Mapping[str, float] | None = None,
    hints: Any = None,
) -> list[str]:
    """A store where ``ingest`` is CLOSED and ``enrich`` never processed a batch; returns
    ingest's output parts (enrich's splits, in order)."""

    def stop_before_enrich(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "before-batch":
            raise InjectedCrash("template: stop before enrich")

    ours = Ours(
        spark, inputs, root, batch_sizes=batch_sizes, target_batch_s=target_batch_s, hints=hints
    )
    try:
        ours.run(fault=stop_before_enrich)
    except InjectedCrash:
        pass
    finally:
        ours.close()
    ingest = ours.coordinator.stage("ingest")
    eod = ingest.final_snapshot.end_of_data if ingest.final_snapshot else None
    return list(eod.manifest) if eod is not None else []


def copy_store(template: Path, dest: Path) -> None:
    """Copy a stopped pipeline's whole root (store, checkpoints, outputs) and re-point the
    absolute checkpoint paths the store holds at the copy."""
    from sqlalchemy import text

    from airflow_finalckpt.store.engine import make_engine

    shutil.copytree(template, dest)
    engine = make_engine(f"sqlite:///{dest}/coordination.db")
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE finalckpt_checkpoints "
                    "SET metadata_path = replace(metadata_path, :old, :new)"
                ),
                {"old": str(template), "new": str(dest)},
            )
    finally:
        engine.dispose()


def part_days(spark: Any, template: Path, parts: list[str]) -> dict[str, list[str]]:
    """The days (ingest splits) each ingest output part holds."""
    from airflow_finalckpt.examples.nycflights13.transforms import SPLIT_ID_COLUMN
    from airflow_finalckpt.spark.stage import spark_path
    from airflow_finalckpt.storage import CheckpointStorage

    storage = CheckpointStorage(str(template / "checkpoints"))
    out = {}
    for part in parts:
        path = spark_path(storage.resolve_handle("bench", part))
        rows = spark.read.parquet(path).select(SPLIT_ID_COLUMN).distinct().collect()
        out[part] = sorted(str(r[0]) for r in rows)
    return out


def crash_hook(coordinator: Any, splits: int, point: float) -> tuple[Any, dict[str, float]]:
    """The fault hook ``(stage_id, point_name)`` that crashes enrich by split progress: at the
    ``mid-batch`` point (the batch computed, not recorded) of the first batch that starts
    once the recorded finished splits reach ``ceil(point x splits)``, or before enrich finishes
    if the batch that reached it was the last. Returns the hook and what it saw (batches before
    the crash, the finished count, the batch that crossed the point, the batch lost)."""
    goal = max(1, math.ceil(point * splits - 1e-9))
    seen: dict[str, float] = {"batches": 0.0}
    recorded: list[int] = []

    def hook(stage_id: str, name: str) -> None:
        if stage_id != "enrich":
            return
        if name in ("mid-batch", "before-finish"):
            finished = len(coordinator.stage("enrich").progress.finished_splits)
            if finished < goal:
                if name == "mid-batch":
                    seen["batches"] += 1
                return
            seen.update(
                finished=float(finished),
                crossing_batch_splits=float(finished - (recorded[-2] if len(recorded) > 1 else 0)),
                lost_batch=float(name == "mid-batch"),
            )
            raise InjectedCrash(f"crash in enrich at {name}, {finished} of {splits} finished")
        if name == "after-record-batch":
            recorded.append(len(coordinator.stage("enrich").progress.finished_splits))

    return hook, seen


def crash_and_resume(
    spark: Any,
    inputs: str,
    root: Path,
    parts: list[str],
    point: float,
    *,
    target_batch_s: Mapping[str, float],
    hints: Any,
    batch_sizes: dict[str, Any],
) -> tuple[dict[str, float], list[str]]:
    """Crash enrich by split progress (``crash_hook``), then resume (timed). Returns the
    metrics and the unfinished parts."""
    first = Ours(
        spark, inputs, root, batch_sizes=batch_sizes, target_batch_s=target_batch_s, hints=hints
    )
    hook, seen = crash_hook(first.coordinator, len(parts), point)
    try:
        first.run(fault=hook)
        raise RuntimeError("the injected crash did not happen")
    except InjectedCrash:
        done = set(first.coordinator.stage("enrich").progress.finished_splits)
    finally:
        first.close()
    lost_batch = len(parts) - len(done)
    reached = len(done) / len(parts)
    crossing = seen.get("crossing_batch_splits", 0.0) / len(parts)
    second = Ours(
        spark, inputs, root, batch_sizes=batch_sizes, target_batch_s=target_batch_s, hints=hints
    )
    try:
        run = second.run()
        enrich_parts = run.processed_splits.get("enrich", 0)
        stages = run.stage_seconds()
        rows = second.output_rows()
        resumed_batches = len(second.batches.get("enrich", []))
    finally:
        second.close()
    unfinished = [p for p in parts if p not in done]
    return {
        "seconds": run.seconds,
        "redone_splits": float(enrich_parts),
        "unfinished_splits": float(lost_batch),
        "finished_before_crash": float(len(done)),
        "finished_fraction": reached,
        # at or above the point, by less than the batch that crossed it
        "within_one_batch": float(point - 1e-9 <= reached < point + crossing + 1e-9),
        "crossing_batch_fraction": crossing,
        "lost_batch_in_flight": seen.get("lost_batch", 0.0),
        "batches_before_crash": seen["batches"],
        "resumed_enrich_batches": float(resumed_batches),
        "ingest_spark_jobs": float(run.processed_splits.get("ingest", 0)),
        "enrich_s": stages.get("enrich", 0.0),
        "protocol_s": sum(run.protocol.values()),
        "output_rows": float(rows),
    }, unfinished


def run(quick: bool = False) -> Result:
    return run_resume(
        plan(quick),
        QUICK_CRASH_POINTS if quick else CRASH_POINTS,
        1 if quick else 3,
    )


def run_resume(
    cfg: dict[str, Any],
    points: tuple[float, ...],
    repetitions: int,
    name: str = NAME,
    *,
    inputs: str | None = None,
    hints_root: Path | None = None,
    rerun_s: float | None = None,
) -> Result:
    """The resume comparison on ``cfg`` (``plan``'s shape). ``inputs``: an input directory of
    ``cfg``'s days and scale (default: generated here); ``hints_root``: the hints of earlier
    runs of the pipeline on these inputs (default: seeded by an untimed warm-up run here);
    ``rerun_s``: the plain whole-pipeline seconds measured elsewhere (then no rerun baseline
    runs here)."""
    target_s: dict[str, float] = dict(cfg["target_batch_s"])
    result = Result(name, repetitions=repetitions)
    result.parameters = {
        **cfg,
        "batch_size": f"auto; enrich's target_batch_s={target_s['enrich']:g} (the default is "
        "30 s, kept by the other stages); ingest (untimed, before the crash) takes fixed "
        "batches of ingest_batch_size days, one enrich split each",
        "hints": "one hints root, seeded by an untimed warm-up run on the same data"
        if hints_root is None
        else "the hints of the steady-state runs on the same data (same process)",
        "crash_points": list(points),
        "crash": "by split progress, through the runtime's fault hook: an exception at "
        "mid-batch (computed, not recorded: its work is lost) of the first enrich batch that "
        "starts once the recorded finished splits reach ceil(point x splits); before enrich "
        "finishes if the batch that reached the point was its last",
        "target": f"ours <= {TARGET_FACTOR} x ideal + {TARGET_CONSTANT_S:g} s, and <= retry",
        "rerun": "plain whole pipeline, measured here"
        if rerun_s is None
        else "plain whole pipeline: the steady-state median (same process, same inputs)",
    }
    spark = spark_session()
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-resume-") as tmp_name:
        tmp = Path(tmp_name)
        if inputs is None:
            inputs = prepare_inputs(tmp / "input", days=cfg["days"], scale=cfg["row_scale"])
        sizes = {"ingest": int(cfg["ingest_batch_size"])}
        if hints_root is None:
            hints = hints_for(tmp / "hints")
            log(f"{name}: warm-up run of ours (seeds the hints)")
            warm = Ours(
                spark, inputs, tmp / "warm", batch_sizes=sizes, target_batch_s=target_s, hints=hints
            )
            warm.run()
            result.parameters["warm_up_batches"] = {s: list(v) for s, v in warm.batches.items()}
            warm.close()
            remove(tmp / "warm")
        else:
            hints = hints_for(hints_root)
        log(f"{name}: template store with ingest closed; plain ingest output")
        template = tmp / "template"
        parts = make_template(spark, inputs, template, sizes, target_batch_s=target_s, hints=hints)
        days_of = part_days(spark, template, parts)
        result.parameters["enrich_splits"] = len(parts)
        result.parameters["days_per_enrich_split"] = [len(days_of[p]) for p in parts]
        plain_src = tmp / "plain-src"
        run_plain(spark, inputs, plain_src, only=("ingest",))

        retry_s, rerun_s, downstream_s = _baselines(
            result,
            spark,
            inputs,
            tmp,
            plain_src,
            repetitions,
            rerun_s,
            days=cfg["days"],
            parts=len(parts),
        )
        for index, point in enumerate(points):
            ideal_parts = len(parts) - int(point * len(parts))
            case = result.case(
                f"crash@{int(point * 100)}%",
                crash_fraction=point,
                enrich_splits=len(parts),
                ideal_unfinished_splits_at_point=ideal_parts,
            )
            unfinished: list[str] | None = None
            for rep in range(repetitions):
                order = ("ours", "ideal") if (index + rep) % 2 == 0 else ("ideal", "ours")
                if unfinished is None:
                    order = ("ours", "ideal")
                for side in order:
                    log(f"{name}: crash at {point:.0%}: {side}")
                    if side == "ours":
                        root = tmp / f"ours-{index}-{rep}"
                        copy_store(template, root)
                        got_ours, unfinished = crash_and_resume(
                            spark,
                            inputs,
                            root,
                            parts,
                            point,
                            target_batch_s=target_s,
                            hints=hints,
                            batch_sizes=sizes,
                        )
                        for metric, value in got_ours.items():
                            case.add(f"ours_{metric}", value)
                        remove(root)
                    else:
                        assert unfinished is not None
                        remaining_days = [d for p in unfinished for d in days_of[p]]
                        where = tmp / f"ideal-{index}-{rep}"
                        started = time.perf_counter()
                        run_plain(
                            spark,
                            inputs,
                            where,
                            only=("enrich",),
                            source_dir=plain_src,
                            enrich_days=remaining_days,
                        )
                        case.add("ideal_enrich_s", time.perf_counter() - started)
                        case.add("ideal_days", float(len(remaining_days)))
                        remove(where)
            case.finalize()
            _judge(result, case, point, parts, retry_s, rerun_s, downstream_s)
        result.medians["retry_s"] = retry_s
        result.medians["rerun_s"] = rerun_s
        result.medians["ours_over_ideal_median"] = median(
            [v for k, v in result.ratios.items() if k.startswith("ours_over_ideal/")]
        )
    return result


def _baselines(
    result: Result,
    spark: Any,
    inputs: str,
    tmp: Path,
    plain_src: Path,
    repetitions: int,
    rerun_s: float | None,
    *,
    days: int,
    parts: int,
) -> tuple[float, float, float]:
    """Airflow's retry of the failed plain task (and a rerun of the DAG unless ``rerun_s`` is
    given): their seconds and the retry's downstream seconds."""
    base = result.case("baselines", parts=parts, days=days)
    for rep in range(repetitions):
        order = ("retry", "rerun") if rep % 2 == 0 else ("rerun", "retry")
        for side in order if rerun_s is None else ("retry",):
            log(f"{result.benchmark}: plain {side}")
            where = tmp / f"plain-{side}-{rep}"
            if side == "retry":
                got = run_plain(spark, inputs, where, only=DOWNSTREAM, source_dir=plain_src)
                stage_s = got.stage_seconds()
                base.add("retry_s", got.seconds)
                base.add("downstream_s", stage_s["delay_windows"] + stage_s["publish"])
            else:
                got = run_plain(spark, inputs, where)
                base.add("rerun_s", got.seconds)
            remove(where)
    base.finalize()
    return (
        base.medians["retry_s"],
        base.medians["rerun_s"] if rerun_s is None else rerun_s,
        base.medians["downstream_s"],
    )


def _judge(
    result: Result,
    case: Any,
    point: float,
    parts: list[str],
    retry_s: float,
    rerun_s: float,
    downstream_s: float,
) -> None:
    """A crash point's ratios and targets from its case's samples."""
    ideal_parts = len(parts) - int(point * len(parts))
    med = case.medians
    case.params["unfinished_splits"] = med["ours_unfinished_splits"]
    reached = case.samples["ours_finished_fraction"]
    case.params["finished_fraction_per_repetition"] = [round(f, 4) for f in reached]
    true_points = all(case.samples["ours_within_one_batch"])
    ours_s = med["ours_seconds"]
    ideal_s = med["ideal_enrich_s"] + downstream_s
    med.update(
        {
            "ideal_s": ideal_s,
            "retry_s": retry_s,
            "rerun_s": rerun_s,
            "ideal_splits": med["ours_unfinished_splits"],
            "retry_redone_splits": float(len(parts)),
            "rerun_redone_splits": float(2 * len(parts)),
        }
    )
    label = f"{int(point * 100)}%"
    result.ratios[f"ours_over_ideal/{label}"] = ratio(ours_s, ideal_s)
    result.ratios[f"retry_over_ideal/{label}"] = ratio(retry_s, ideal_s)
    result.ratios[f"rerun_over_ideal/{label}"] = ratio(rerun_s, ideal_s)
    result.ratios[f"ours_over_retry/{label}"] = ratio(ours_s, retry_s)
    result.ratios[f"redone_splits_ours_over_unfinished/{label}"] = ratio(
        med["ours_redone_splits"], med["ours_unfinished_splits"]
    )
    result.ratios[f"redone_splits_ours_over_ideal_at_point/{label}"] = ratio(
        med["ours_redone_splits"], ideal_parts
    )
    allowed = TARGET_FACTOR * ideal_s + TARGET_CONSTANT_S
    result.targets.append(
        Target(
            name=f"recovery seconds, crash at {label} of enrich",
            target=f"ours <= {TARGET_FACTOR} x ideal + {TARGET_CONSTANT_S:g} s",
            measured=ours_s,
            unit="s",
            passed=bool(ours_s <= allowed),
            note=f"ideal {ideal_s:.1f} s (allowed {allowed:.1f} s); retry "
            f"{retry_s:.1f} s; rerun {rerun_s:.1f} s; actual finished fraction "
            f"{med['ours_finished_fraction']:.2f}",
        )
    )
    result.targets.append(
        Target(
            name=f"recovery seconds vs Airflow's retry, crash at {label}",
            target="ours <= retry of the failed plain task",
            measured=ours_s,
            unit="s",
            passed=bool(ours_s <= retry_s),
            note=f"retry {retry_s:.1f} s",
        )
    )
    result.targets.append(
        Target(
            name=f"crash point, crash at {label} of enrich",
            target="finished fraction at the crash >= the point, above it by less "
            "than the batch that crossed it, in every repetition",
            measured=min(reached),
            passed=bool(true_points),
            note="finished fractions reached: "
            + ", ".join(f"{f:.3f}" for f in reached)
            + "; crossing batches: "
            + ", ".join(f"{f:.3f}" for f in case.samples["ours_crossing_batch_fraction"]),
        )
    )
    exact = case.samples["ours_redone_splits"] == case.samples["ours_unfinished_splits"]
    result.targets.append(
        Target(
            name=f"redone enrich splits, crash at {label}",
            target="ours == the unfinished splits, in every sample",
            measured=med["ours_redone_splits"],
            passed=bool(exact),
            note=f"unfinished at the crash {med['ours_unfinished_splits']:.0f} of "
            f"{len(parts)} (ideal at exactly {label}: {ideal_parts}); retry "
            f"{len(parts)}, rerun {len(parts)} (+ ingest)",
        )
    )
