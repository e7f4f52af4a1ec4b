"""The rule that a stage whose attempt is gone never holds a checkpoint hostage
(``core.plan.attempt_gone`` / ``attempts_gone`` / ``must_acknowledge``), on plain values, and the
runtime's side of it (``runtime.lease.AttemptLease``: renew while running, release on failure)
through the real runner on SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import StaleEpochError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointState,
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StateHandle,
)
from airflow_finalckpt.core.plan import attempt_gone, attempts_gone, must_acknowledge
from airflow_finalckpt.runtime.lease import AttemptLease
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, StageRunner, StageSpec
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

RUNNING = StageLifecycle.RUNNING


@pytest.mark.parametrize(
    ("lifecycle", "lease", "now", "gone"),
    [
        (RUNNING, None, 1e12, False),  # no lease: alive (an older version's attempt)
        (RUNNING, 100.0, 99.9, False),  # lease still running
        (RUNNING, 100.0, 100.0, True),  # lease ends now
        (RUNNING, 0.0, 1.0, True),  # released by its failure path
        (StageLifecycle.SUSPENDED, 0.0, 1.0, False),  # only a RUNNING stage answers at batches
        (StageLifecycle.FINISHED, 0.0, 1.0, False),
        (StageLifecycle.NOT_STARTED, 0.0, 1.0, False),
    ],
)
def test_attempt_gone(
    lifecycle: StageLifecycle, lease: float | None, now: float, gone: bool
) -> None:
    assert attempt_gone(lifecycle, lease, now) is gone


def test_the_coordinator_answers_only_for_gone_attempts() -> None:
    to_ack = ("a", "b", "c", "d")
    lifecycles = {"a": RUNNING, "b": RUNNING, "c": RUNNING, "d": StageLifecycle.SUSPENDED}
    leases = {"a": 50.0, "b": 10.0, "d": 0.0}  # c holds no lease
    assert attempts_gone(to_ack, lifecycles, leases, now=20.0) == ("b",)
    assert must_acknowledge(to_ack, lifecycles, leases, now=20.0) == ("a", "c", "d")
    assert attempts_gone(to_ack, lifecycles, leases, now=60.0) == ("a", "b")
    assert attempts_gone((), lifecycles, leases, now=60.0) == ()


class Failing:
    """Fails its second batch (a task error the task reports) after ``before_failing``."""

    def __init__(self, before_failing: Callable[[], None]) -> None:
        self.batches = 0
        self.before_failing = before_failing

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        del state, watermark

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        self.batches += 1
        if self.batches == 2:
            self.before_failing()
            raise RuntimeError("the stage's transform failed")
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, event: Any, *args: Any, **kw: Any) -> None:
        self.lines.append(str(event) % args)


def test_a_failed_attempt_releases_its_lease_and_a_sibling_checkpoint_completes(
    tmp_path: Path,
) -> None:
    """x finishes while y runs (between y's first and second batch): x's final checkpoint waits
    for y; y's second batch fails, the runner releases the attempt before the error propagates,
    and the checkpoint completes with y recorded from its first batch. Without the release it
    stays PENDING (as before issue 25).
    """
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coord = Coordinator(engine, "gone")
    coord.register(StageGraph.from_edges(["x", "y"], []))
    pending: list[int] = []

    def x_finishes() -> None:
        outcome = coord.finish("x", coord.start_attempt("x").epoch, _final())
        assert outcome.eager_checkpoint_id is not None
        pending.append(outcome.eager_checkpoint_id)
        assert coord.checkpoint(pending[0]).state is CheckpointState.PENDING
        y_epoch = coord.stage("y").epoch
        assert coord.release_attempt("y", y_epoch - 1) == ()  # a stale release: nothing
        assert coord.checkpoint(pending[0]).state is CheckpointState.PENDING

    spec = StageSpec(pipeline_key="gone", stage_id="y", splits=("y0", "y1", "y2"), batch_size=1)
    log = Lines()
    with pytest.raises(RuntimeError, match="transform failed"):
        StageRunner(coord, spec, Failing(x_finishes), log=log).run()
    assert coord.checkpoint(pending[0]).state is CheckpointState.COMPLETED
    assert coord.closable_checkpoint("x") == pending[0]
    assert any("failed (RuntimeError): released" in line for line in log.lines)
    # the next attempt continues from y's durable progress (y0), as before
    assert coord.stage("y").progress.finished_splits == frozenset({"y0"})
    engine.dispose()


def test_the_lease_is_renewed_while_running_and_a_stale_exit_keeps_it(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    coord = Coordinator(engine, "renew", clock=lambda: 1000.0)
    coord.register(StageGraph.from_edges(["y"], []))
    view = coord.start_attempt("y")
    with AttemptLease(coord, "y", view.epoch, 30.0, Lines()):
        assert _lease(coord, "y") == 1030.0
    with pytest.raises(StaleEpochError), AttemptLease(coord, "y", view.epoch, 30.0, Lines()):
        raise StaleEpochError("y", view.epoch, view.epoch + 1)
    assert _lease(coord, "y") == 1030.0  # a fenced attempt does not release the stage
    assert coord.renew_lease("y", view.epoch + 1, 30.0) is False  # not the running attempt
    with pytest.raises(ValueError, match="attempt_lease_s must be > 0"):
        AttemptLease(coord, "y", view.epoch, 0, Lines())
    engine.dispose()


def _lease(coord: Coordinator, stage_id: str) -> float | None:
    with coord.store.read() as rows:
        return rows.stage_row(stage_id).lease_until


def _final() -> StageSnapshot:
    return StageSnapshot(end_of_data=EndOfData(manifest=[]))
