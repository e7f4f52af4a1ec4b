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
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Result, Target, log, median, ratio, spark_session
from benchmarks.pipelines import Ours, prepare_inputs, remove, run_plain

NAME = "resume_savings"
CRASH_POINTS = (0.25, 0.5, 0.75)
#: The quick (CI smoke) mode checks one crash point only.
QUICK_CRASH_POINTS = (0.5,)
TARGET_FACTOR = 1.10
#: The "small constant" of the target ours <= 1.10 x ideal + constant: resuming pays a fixed
#: cost (new attempt, restored stage-global state, the final checkpoints of the resumed stages).
TARGET_CONSTANT_S = 5.0
DOWNSTREAM = ("enrich", "delay_windows", "publish")


class InjectedCrash(RuntimeError):
    """The benchmark's crash in the middle of an enrich batch."""


def plan(quick: bool) -> dict[str, int]:
    """Days, row scale and batch sizes: enrich gets ``parts`` splits (ingest output parts).

    The full run uses every flight ten times (``row_scale``, ~0.42 M flights over 48 days) so
    a split batch holds real work next to Spark's fixed cost per job; set
    ``FINALCKPT_BENCH_RESUME_SCALE=1`` for the original rows.
    """
    if quick:
        return {"days": 2, "row_scale": 1, "ingest_batch": 1, "parts": 2}
    scale = int(os.environ.get("FINALCKPT_BENCH_RESUME_SCALE", "10"))
    return {"days": 48, "row_scale": scale, "ingest_batch": 6, "parts": 8}


def batch_sizes(ingest_batch: int) -> dict[str, int]:
    return {"ingest": ingest_batch, "enrich": 1, "delay_windows": 2, "publish": 2}


def make_template(spark: Any, inputs: str, root: Path, sizes: dict[str, int]) -> None:
    """A store where ``ingest`` is CLOSED and ``enrich`` never processed a batch."""

    def stop_before_enrich(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "before-batch":
            raise InjectedCrash("template: stop before enrich")

    ours = Ours(spark, inputs, root, batch_sizes=sizes)
    try:
        ours.run(fault=stop_before_enrich)
    except InjectedCrash:
        pass
    finally:
        ours.close()


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


def crash_and_resume(
    spark: Any, inputs: str, root: Path, sizes: dict[str, int], crash_after: int
) -> dict[str, float]:
    """Crash enrich mid-batch after ``crash_after`` recorded batches, then resume (timed)."""
    seen = {"batches": 0}

    def crash(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "mid-batch":
            seen["batches"] += 1
            if seen["batches"] == crash_after + 1:
                raise InjectedCrash(f"crash in enrich batch {crash_after + 1}")

    first = Ours(spark, inputs, root, batch_sizes=sizes)
    try:
        first.run(fault=crash)
        raise RuntimeError("the injected crash did not happen")
    except InjectedCrash:
        finished_before = len(first.coordinator.stage("enrich").progress.finished_splits)
    finally:
        first.close()
    second = Ours(spark, inputs, root, batch_sizes=sizes)
    try:
        run = second.run()
        enrich_parts = run.processed_splits.get("enrich", 0)
        stages = run.stage_seconds()
        rows = second.output_rows()
    finally:
        second.close()
    return {
        "seconds": run.seconds,
        "redone_splits": float(enrich_parts),
        "finished_before_crash": float(finished_before),
        "ingest_spark_jobs": float(run.processed_splits.get("ingest", 0)),
        "enrich_s": stages.get("enrich", 0.0),
        "protocol_s": sum(run.protocol.values()),
        "output_rows": float(rows),
    }


def run(quick: bool = False) -> Result:
    from airflow_finalckpt.examples.nycflights13.data import open_layout

    cfg = plan(quick)
    sizes = batch_sizes(cfg["ingest_batch"])
    repetitions = 1 if quick else 2
    result = Result(NAME, repetitions=repetitions)
    result.parameters = {
        **cfg,
        "batch_sizes": sizes,
        "crash_points": list(QUICK_CRASH_POINTS if quick else CRASH_POINTS),
        "crash": "exception in the middle of an enrich batch (computed, not recorded)",
        "target": f"ours <= {TARGET_FACTOR} x ideal + {TARGET_CONSTANT_S:g} s",
    }
    spark = spark_session()
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-resume-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = prepare_inputs(tmp / "input", days=cfg["days"], scale=cfg["row_scale"])
        days = list(open_layout(inputs).split_ids)
        log(f"{NAME}: template store with ingest closed; plain ingest output")
        template = tmp / "template"
        make_template(spark, inputs, template, sizes)
        plain_src = tmp / "plain-src"
        run_plain(spark, inputs, plain_src, only=("ingest",))
        part_days = [
            days[i : i + cfg["ingest_batch"]] for i in range(0, len(days), cfg["ingest_batch"])
        ]
        parts = len(part_days)

        base = result.case("baselines", parts=parts, days=len(days))
        for rep in range(repetitions):
            order = ("retry", "rerun") if rep % 2 == 0 else ("rerun", "retry")
            for side in order:
                log(f"{NAME}: plain {side}")
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
        retry_s = base.medians["retry_s"]
        rerun_s = base.medians["rerun_s"]
        downstream_s = base.medians["downstream_s"]

        for index, point in enumerate(QUICK_CRASH_POINTS if quick else CRASH_POINTS):
            crash_after = round(parts * point)
            remaining_days = [d for chunk in part_days[crash_after:] for d in chunk]
            case = result.case(
                f"crash@{int(point * 100)}%",
                crash_fraction=point,
                crash_after_batches=crash_after,
                enrich_splits=parts,
                unfinished_splits=parts - crash_after,
                unfinished_days=len(remaining_days),
            )
            for rep in range(repetitions):
                order = ("ours", "ideal") if (index + rep) % 2 == 0 else ("ideal", "ours")
                for side in order:
                    log(f"{NAME}: crash at {point:.0%}: {side}")
                    if side == "ours":
                        root = tmp / f"ours-{index}-{rep}"
                        copy_store(template, root)
                        got_ours = crash_and_resume(spark, inputs, root, sizes, crash_after)
                        for metric, value in got_ours.items():
                            case.add(f"ours_{metric}", value)
                        remove(root)
                    else:
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
                        remove(where)
            case.finalize()
            ours_s = case.medians["ours_seconds"]
            ideal_s = case.medians["ideal_enrich_s"] + downstream_s
            case.medians.update(
                {
                    "ideal_s": ideal_s,
                    "retry_s": retry_s,
                    "rerun_s": rerun_s,
                    "ideal_splits": float(parts - crash_after),
                    "retry_redone_splits": float(parts),
                    "rerun_redone_splits": float(2 * parts),
                }
            )
            label = f"{int(point * 100)}%"
            result.ratios[f"ours_over_ideal/{label}"] = ratio(ours_s, ideal_s)
            result.ratios[f"retry_over_ideal/{label}"] = ratio(retry_s, ideal_s)
            result.ratios[f"rerun_over_ideal/{label}"] = ratio(rerun_s, ideal_s)
            result.ratios[f"ours_over_retry/{label}"] = ratio(ours_s, retry_s)
            result.ratios[f"redone_splits_ours_over_ideal/{label}"] = ratio(
                case.medians["ours_redone_splits"], parts - crash_after
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
                    f"{retry_s:.1f} s; rerun {rerun_s:.1f} s",
                )
            )
            result.targets.append(
                Target(
                    name=f"redone enrich splits, crash at {label}",
                    target="ours == ideal (only the unfinished splits)",
                    measured=case.medians["ours_redone_splits"],
                    passed=bool(case.medians["ours_redone_splits"] == parts - crash_after),
                    note=f"ideal {parts - crash_after}, retry {parts}, rerun {parts} "
                    f"(+ {parts} ingest splits)",
                )
            )
        result.medians["retry_s"] = retry_s
        result.medians["rerun_s"] = rerun_s
        result.medians["ours_over_ideal_median"] = median(
            [v for k, v in result.ratios.items() if k.startswith("ours_over_ideal/")]
        )
    return result
