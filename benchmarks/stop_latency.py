"""Stop latency: a stop request -> the savepoint it asked for, on the real runtime and real Spark.

The example pipeline runs through ``run_example_locally`` (``benchmarks.pipelines.Ours``: SQLite
store, local checkpoint storage, both sinks), and an operator presses *stop* while a stage is in
the middle of its split batches. The press is a ``Coordinator.request_stop`` on a second
coordinator object over the same store (what the CLI / REST call does in another process), made
at one of two moments of a split batch:

* ``start``: from the runtime's ``before-batch`` fault point of batch k, i.e. just after the stage
  passed its batch boundary: the worst case, a whole split batch must still run before the stage
  can answer;
* ``mid``: from a timer thread started at that point, half the previous batch's duration later:
  the typical case.

Two stop modes:

* **savepoint** (stop with savepoint) while ``enrich`` runs (every run starts from a copy of one
  store where ``ingest`` is CLOSED, like the resume benchmark). Measured: request -> savepoint
  COMPLETED (the stop row's ``finished_at``), and request -> the stage returned SUSPENDED (its
  Spark work for the attempt is over; the Airflow operator then stops its SparkSession and defers).
* **drain** (stop with drain) while the source stage ``ingest`` runs. Measured: request -> the
  source stage finished (``end_of_data`` with ``drain=true``), and request -> the drained
  savepoint COMPLETED, which comes after every downstream stage processed what was read and
  closed (so it grows with the data read, not with the stop).

Every latency is also reported in units of the stage's split-batch duration (median of the
batches of the same run): the stop issue's target is *at most one split batch plus a few
seconds*. There is no plain-Airflow equivalent of a safe stop: a plain user kills the task (or
marks the run failed); that is immediate but every split the killed stage attempt finished is
lost and redone by the next run. Reported for comparison, from the same runs: the splits our stop
kept (recorded before the savepoint, never redone) that a kill would have thrown away.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Result, Target, log, median, ratio, spark_session
from benchmarks.pipelines import Ours, prepare_inputs, remove
from benchmarks.resume import copy_store, make_template

NAME = "stop_latency"
#: The "few seconds" of the target: one split batch + this.
TARGET_SLACK_S = 3.0
PRESS_POINTS = ("start", "mid")
#: Auto batches' target duration here: small enough that the source and enrich run in several
#: batches on 8 days whatever the machine's load (the runtime's default, 30 s, would run each in
#: one or two; at 1 s on a quiet machine enrich's batch 2 was its last, so the stop found the
#: stage finished); the latency is reported in units of the batch that was running, so it
#: holds for any target.
TARGET_BATCH_S = 0.1
#: Quick mode: one split per batch.
QUICK_TARGET_BATCH_S = 0.01


def plan(quick: bool) -> dict[str, Any]:
    """Days, row scale, auto batches and their target duration, the batch (1-based) of enrich
    (savepoint) or ingest (drain) during which stop is pressed (batch 2: the first batch sized
    from a measured one), and the press points."""
    if quick:
        return {
            "days": 5,
            "row_scale": 1,
            "batch_size": "auto",
            "target_batch_s": QUICK_TARGET_BATCH_S,
            "press_batch": 2,
            "drain_press_batch": 2,
            "press_points": ["mid"],
            "repetitions": 1,
        }
    return {
        "days": 8,
        "row_scale": 4,
        "batch_size": "auto",
        "target_batch_s": TARGET_BATCH_S,
        "press_batch": 2,
        "drain_press_batch": 2,
        "press_points": list(PRESS_POINTS),
        "repetitions": 3,
    }


class Press:
    """Presses stop during batch ``press_batch`` of ``stage``; records batch and stop times
    (wall clock ``time.time``, the coordinator's clock)."""

    def __init__(self, ours: Ours, stage: str, mode: Any, where: str, press_batch: int) -> None:
        from airflow_finalckpt.coordination import Coordinator

        # A second coordinator object on the same store: the operator's CLI / REST call.
        self.operator = Coordinator(ours.engine, ours.coordinator.pipeline_key, writer=ours.storage)
        self.stage = stage
        self.mode = mode
        self.where = where
        self.press_batch = press_batch
        self.batch_started: list[float] = []
        self.batch_seconds: list[float] = []
        self.requested_at: float | None = None
        self.source_finished_at: float | None = None
        self.stage_started_at: float | None = None
        self.timer: threading.Timer | None = None

    def press(self) -> None:
        self.requested_at = time.time()
        self.operator.request_stop(self.mode, "benchmark")

    def hook(self, stage_id: str, point: str) -> None:
        if stage_id != self.stage:
            return
        now = time.time()
        if self.stage_started_at is None:
            self.stage_started_at = now
        if point == "before-batch":
            self.batch_started.append(now)
            if len(self.batch_started) == self.press_batch and self.requested_at is None:
                if self.where == "start" or not self.batch_seconds:
                    self.press()
                else:
                    delay = 0.5 * self.batch_seconds[-1]
                    self.timer = threading.Timer(delay, self.press)
                    self.timer.start()
        elif point == "after-record-batch" and len(self.batch_seconds) < len(self.batch_started):
            self.batch_seconds.append(now - self.batch_started[-1])
        elif point == "after-finish":
            self.source_finished_at = now

    def join(self) -> None:
        if self.timer is not None:
            self.timer.join()

    def pressed_batch_s(self) -> float:
        """Duration of the split batch that was running when stop was pressed (before-batch
        to after-record-batch): the batch the stop had to wait for."""
        index = self.press_batch - 1
        if len(self.batch_seconds) <= index:
            raise RuntimeError(f"batch {self.press_batch} of {self.stage} was never recorded")
        return self.batch_seconds[index]

    def prior_batch_s(self) -> float:
        return median(self.batch_seconds[: self.press_batch - 1])


def savepoint_sample(
    spark: Any, inputs: str, template: Path, root: Path, cfg: dict[str, Any], where: str
) -> dict[str, float]:
    from airflow_finalckpt.core.model import StopMode, StopState

    copy_store(template, root)
    ours = Ours(spark, inputs, root, target_batch_s=cfg["target_batch_s"])
    try:
        press = Press(ours, "enrich", StopMode.SAVEPOINT, where, cfg["press_batch"])
        ours.run(fault=press.hook)
        returned_at = time.time()
        press.join()
        stop = ours.coordinator.stop_request()
        if stop is None or stop.state is not StopState.COMPLETED or stop.finished_at is None:
            raise RuntimeError(f"the stop with savepoint did not complete: {stop}")
        enrich = ours.coordinator.stage("enrich")
        if enrich.lifecycle.value != "SUSPENDED":
            raise RuntimeError(f"enrich is {enrich.lifecycle}, not SUSPENDED")
        assert press.requested_at is not None and press.stage_started_at is not None
        batch_s = press.pressed_batch_s()
        kept = len(enrich.progress.finished_splits)
        return {
            "savepoint_s": stop.finished_at - press.requested_at,
            "suspended_s": returned_at - press.requested_at,
            "batch_s": batch_s,
            "prior_batch_s": press.prior_batch_s(),
            "savepoint_batches": (stop.finished_at - press.requested_at) / batch_s,
            "suspended_batches": (returned_at - press.requested_at) / batch_s,
            "splits_kept": float(kept),
            "kill_splits_lost": float(kept),
            "stage_work_before_press_s": press.requested_at - press.stage_started_at,
        }
    finally:
        ours.close()
        remove(root)


def drain_sample(
    spark: Any, inputs: str, root: Path, cfg: dict[str, Any], where: str
) -> dict[str, float]:
    from airflow_finalckpt.core.model import StopMode, StopState

    ours = Ours(spark, inputs, root, target_batch_s=cfg["target_batch_s"])
    try:
        press = Press(ours, "ingest", StopMode.DRAIN, where, cfg["drain_press_batch"])
        ours.run(fault=press.hook)
        press.join()
        stop = ours.coordinator.stop_request()
        if stop is None or stop.state is not StopState.COMPLETED or stop.finished_at is None:
            raise RuntimeError(f"the stop with drain did not complete: {stop}")
        ingest = ours.coordinator.stage("ingest")
        eod = ingest.final_snapshot.end_of_data if ingest.final_snapshot else None
        if eod is None or not eod.drain:
            raise RuntimeError("ingest did not finish drained")
        assert press.requested_at is not None and press.source_finished_at is not None
        batch_s = press.pressed_batch_s()
        return {
            "source_finished_s": press.source_finished_at - press.requested_at,
            "drained_savepoint_s": stop.finished_at - press.requested_at,
            "batch_s": batch_s,
            "prior_batch_s": press.prior_batch_s(),
            "source_finished_batches": (press.source_finished_at - press.requested_at) / batch_s,
            "drained_savepoint_batches": (stop.finished_at - press.requested_at) / batch_s,
            "unread_splits": float(eod.unread_splits),
            "read_splits": float(len(ingest.progress.finished_splits)),
        }
    finally:
        ours.close()
        remove(root)


def _judge_case(result: Result, mode: str, where: str, med: dict[str, float]) -> None:
    """The ratios and targets of one (mode, press point) case, from its medians."""
    batch_s = med["batch_s"]
    allowed = batch_s + TARGET_SLACK_S
    checks: tuple[tuple[str, str], ...]
    if mode == "savepoint":
        result.ratios[f"savepoint_over_batch/{where}"] = ratio(med["savepoint_s"], batch_s)
        result.ratios[f"suspended_over_batch/{where}"] = ratio(med["suspended_s"], batch_s)
        checks = (
            ("request -> savepoint complete", "savepoint_s"),
            ("request -> stage suspended (Spark work over)", "suspended_s"),
        )
    else:
        result.ratios[f"source_finished_over_batch/{where}"] = ratio(
            med["source_finished_s"], batch_s
        )
        result.ratios[f"drained_savepoint_over_batch/{where}"] = ratio(
            med["drained_savepoint_s"], batch_s
        )
        checks = (("request -> source stage finished (drained)", "source_finished_s"),)
    for label, metric in checks:
        result.targets.append(
            Target(
                name=f"stop with {mode}, press at batch {where}: {label}",
                target=f"<= 1 split batch + {TARGET_SLACK_S:g} s",
                measured=med[metric],
                unit="s",
                passed=bool(med[metric] <= allowed),
                note=f"split batch {batch_s:.2f} s (allowed {allowed:.2f} s); "
                f"{med[metric] / batch_s:.2f} batches",
            )
        )
    if mode == "drain":
        result.targets.append(
            Target(
                name=f"stop with drain, press at batch {where}: request -> drained "
                "savepoint complete",
                target="(not judged: every downstream stage processes what was read first)",
                measured=med["drained_savepoint_s"],
                unit="s",
                passed=None,
                note=f"{med['drained_savepoint_batches']:.1f} source batches; "
                f"{med['read_splits']:.0f} splits read, {med['unread_splits']:.0f} unread",
            )
        )


def run(quick: bool = False) -> Result:
    cfg = plan(quick)
    reps = int(cfg["repetitions"])
    result = Result(NAME, repetitions=reps)
    result.parameters = {
        **cfg,
        "press_point_meaning": {
            "start": "at the stage's before-batch point of batch press_batch (worst case: a "
            "whole batch to go)",
            "mid": "half the previous batch's duration after that point (typical)",
        },
        "savepoint_stage": "enrich (ingest closed; every sample from a copy of one store)",
        "drain_stage": "ingest (the source stage)",
        "order": "alternating press points and modes per repetition",
        "target": f"latency <= 1 split batch + {TARGET_SLACK_S:g} s",
        "plain_airflow": "no safe stop: kill the task (all finished splits of the attempt lost)",
    }
    spark = spark_session()
    points = tuple(cfg["press_points"])
    cases = {
        (mode, where): result.case(f"{mode}/{where}", mode=mode, press=where)
        for mode in ("savepoint", "drain")
        for where in points
    }
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-stop-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = prepare_inputs(tmp / "input", days=cfg["days"], scale=cfg["row_scale"])
        log(f"{NAME}: template store with ingest closed")
        template = tmp / "template"
        make_template(spark, inputs, template, target_batch_s=cfg["target_batch_s"])
        counter = 0
        for rep in range(reps):
            order = [(m, w) for m in ("savepoint", "drain") for w in points]
            if rep % 2:
                order.reverse()
            for mode, where in order:
                counter += 1
                log(f"{NAME}: {mode}, press {where} of a batch (rep {rep})")
                root = tmp / f"run-{counter}"
                if mode == "savepoint":
                    sample = savepoint_sample(spark, inputs, template, root, cfg, where)
                else:
                    sample = drain_sample(spark, inputs, root, cfg, where)
                for metric, value in sample.items():
                    cases[(mode, where)].add(metric, value)
    for case in result.cases:
        case.finalize()
    for (mode, where), case in cases.items():
        _judge_case(result, mode, where, case.medians)
    result.medians = {
        f"{mode}/{where}/{metric}": case.medians[metric]
        for (mode, where), case in cases.items()
        for metric in (
            ("savepoint_s", "suspended_s")
            if mode == "savepoint"
            else ("source_finished_s", "drained_savepoint_s")
        )
    }
    result.notes.append(
        "plain Airflow has no safe stop: killing the task is immediate, but the splits the "
        "stage attempt finished (kill_splits_lost, the same runs) are lost and redone; with a "
        "stop with savepoint they are kept (splits_kept) and only unfinished splits run after "
        "the resume"
    )
    return result
