"""The read model waiting stages share (``PipelineSnapshot``): its decisions without a database,
then ``Coordinator.waiting_snapshot`` against a real store, agreeing with the coordinator's own
answers (``closable_checkpoint``, the read-only check of ``ensure_final_checkpoint``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from airflow_finalckpt.coordination import (
    Coordinator,
    CoordinatorOptions,
    PipelineSnapshot,
    StopRequest,
    WaitingStage,
)
from airflow_finalckpt.core.errors import UnknownPipelineError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
)
from airflow_finalckpt.store.engine import make_engine

KEY = "snapshot-pipeline"
NOW = 10_000.0

# ---------------------------------------------------------------------------------- decisions


def stage(
    stage_id: str = "a",
    lifecycle: StageLifecycle = StageLifecycle.FINISHED,
    *,
    epoch: int = 1,
    threshold: int | None = 5,
    closed: int | None = None,
    completed: int | None = None,
    candidate: int | None = 5,
) -> WaitingStage:
    return WaitingStage(
        stage_id=stage_id,
        lifecycle=lifecycle,
        epoch=epoch,
        finish_threshold=threshold,
        closed_checkpoint_id=closed,
        first_completed_id=completed,
        first_candidate_id=candidate,
    )


def stop(mode: StopMode, state: StopState) -> StopRequest:
    return StopRequest(
        request_id=1,
        mode=mode,
        state=state,
        savepoint_id=4,
        requested_by="test",
        requested_at=NOW - 10,
        finished_at=None,
        failure_reason=None,
    )


def snapshot(
    *stages: WaitingStage,
    stop_request: StopRequest | None = None,
    pending: tuple[tuple[int, float], ...] = ((5, NOW - 1),),
    timeout: float = 600.0,
) -> PipelineSnapshot:
    return PipelineSnapshot(
        pipeline_key=KEY,
        checkpoint_timeout_s=timeout,
        stages={s.stage_id: s for s in stages},
        stop=stop_request,
        pending=pending,
    )


def test_a_finished_stage_with_its_checkpoint_in_flight_is_idle() -> None:
    snap = snapshot(stage())
    assert snap.closable_checkpoint("a") is None
    assert not snap.final_checkpoint_work("a", NOW)
    assert snap.final_checkpoint_idle("a", 1, NOW)
    assert snap.final_checkpoint_idle("a", None, NOW)  # no epoch given: not checked


def test_a_completed_checkpoint_makes_the_stage_closable() -> None:
    snap = snapshot(stage(completed=6, candidate=5))
    assert snap.closable_checkpoint("a") == 6
    assert not snap.final_checkpoint_idle("a", 1, NOW)


def test_a_savepoint_in_progress_holds_the_close_back() -> None:
    requested = snapshot(
        stage(completed=6), stop_request=stop(StopMode.SAVEPOINT, StopState.REQUESTED)
    )
    assert requested.closable_checkpoint("a") is None
    assert requested.final_checkpoint_idle("a", 1, NOW)
    # Completed (suspended): the close is no longer held back, as in closable_checkpoint.
    done = snapshot(stage(completed=6), stop_request=stop(StopMode.SAVEPOINT, StopState.COMPLETED))
    assert done.closable_checkpoint("a") == 6


def test_a_closed_stage_reports_its_checkpoint() -> None:
    snap = snapshot(stage(lifecycle=StageLifecycle.CLOSED, closed=7))
    assert snap.closable_checkpoint("a") == 7
    assert not snap.final_checkpoint_idle("a", 1, NOW)


@pytest.mark.parametrize("epoch", [0, 2], ids=["older", "newer"])
def test_another_epoch_is_not_idle(epoch: int) -> None:
    """Stale (or a snapshot older than the attempt): the coordinator must decide."""
    assert not snapshot(stage(epoch=1)).final_checkpoint_idle("a", epoch, NOW)


@pytest.mark.parametrize(
    "lifecycle", [StageLifecycle.NOT_STARTED, StageLifecycle.RUNNING, StageLifecycle.SUSPENDED]
)
def test_a_stage_that_is_not_finished_is_not_idle(lifecycle: StageLifecycle) -> None:
    snap = snapshot(stage(lifecycle=lifecycle, threshold=None, candidate=None))
    assert snap.closable_checkpoint("a") is None
    assert not snap.final_checkpoint_work("a", NOW)
    assert not snap.final_checkpoint_idle("a", 1, NOW)


def test_an_unknown_stage_is_not_idle() -> None:
    snap = snapshot(stage("a"))
    assert snap.closable_checkpoint("typo") is None
    assert not snap.final_checkpoint_idle("typo", 1, NOW)
    assert not snap.resume_idle("typo", 1)
    assert not snap.closed_idle("typo")


def test_a_timed_out_checkpoint_is_write_work_for_every_waiter() -> None:
    snap = snapshot(stage("a"), stage("b"), pending=((3, NOW - 601), (5, NOW - 1)))
    assert snap.timed_out(NOW) == [3]
    assert snap.final_checkpoint_work("a", NOW) and snap.final_checkpoint_work("b", NOW)
    assert not snap.final_checkpoint_idle("a", 1, NOW)
    assert snap.timed_out(NOW - 10) == []  # not yet, ten seconds earlier


def test_no_candidate_checkpoint_is_write_work() -> None:
    snap = snapshot(stage(candidate=None), pending=())
    assert snap.final_checkpoint_work("a", NOW)
    assert not snap.final_checkpoint_idle("a", 1, NOW)


@pytest.mark.parametrize(
    ("stop_request", "work"),
    [
        (stop(StopMode.SAVEPOINT, StopState.REQUESTED), False),
        (stop(StopMode.SAVEPOINT, StopState.COMPLETED), False),
        (stop(StopMode.SAVEPOINT, StopState.FAILED), True),
        (stop(StopMode.SAVEPOINT, StopState.RESUMED), True),
        (stop(StopMode.DRAIN, StopState.REQUESTED), True),
    ],
    ids=["savepoint-requested", "suspended", "failed", "resumed", "draining"],
)
def test_a_stop_with_savepoint_means_waiting_for_it_not_triggering(
    stop_request: StopRequest, work: bool
) -> None:
    snap = snapshot(stage(candidate=None), stop_request=stop_request, pending=())
    assert snap.final_checkpoint_work("a", NOW) is work


@pytest.mark.parametrize(
    ("stop_request", "idle"),
    [
        (stop(StopMode.SAVEPOINT, StopState.REQUESTED), True),
        (stop(StopMode.SAVEPOINT, StopState.COMPLETED), True),
        (stop(StopMode.SAVEPOINT, StopState.RESUMED), False),
        (stop(StopMode.SAVEPOINT, StopState.FAILED), False),
        (stop(StopMode.DRAIN, StopState.COMPLETED), False),
        (None, False),
    ],
    ids=["savepoint-requested", "suspended", "resumed", "failed", "drained", "none"],
)
def test_resume_waits_only_while_a_stop_with_savepoint_holds(
    stop_request: StopRequest | None, idle: bool
) -> None:
    snap = snapshot(stage(lifecycle=StageLifecycle.SUSPENDED), stop_request=stop_request)
    assert snap.resume_idle("a", 1) is idle
    assert snap.resume_idle("a", None) is idle
    assert not snap.resume_idle("a", 2)  # stale attempt: the coordinator says so


def test_closed_idle_until_the_stage_is_closed() -> None:
    assert snapshot(stage(lifecycle=StageLifecycle.FINISHED)).closed_idle("a")
    assert not snapshot(stage(lifecycle=StageLifecycle.CLOSED, closed=3)).closed_idle("a")


# ---------------------------------------------------------------------------------- the read


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def finish(coordinator: Coordinator, stage_id: str, epoch: int) -> int | None:
    return coordinator.finish(
        stage_id, epoch, StageSnapshot(end_of_data=EndOfData(manifest=["p"]))
    ).eager_checkpoint_id


def assert_agrees(coordinator: Coordinator, clock: Clock) -> PipelineSnapshot:
    """The snapshot's answers are the coordinator's, for every stage."""
    snap = coordinator.waiting_snapshot()
    stage_ids = list(coordinator.stages())
    assert sorted(snap.stages) == stage_ids
    for sid in stage_ids:
        assert snap.closable_checkpoint(sid) == coordinator.closable_checkpoint(sid), sid
    # One read at a time: a SQLite read holds the database (BEGIN IMMEDIATE).
    with coordinator.store.read() as rows:
        work = {
            sid: coordinator._final_checkpoint_work(rows, sid, expire=True) for sid in stage_ids
        }
    assert {sid: snap.final_checkpoint_work(sid, clock.now) for sid in stage_ids} == work
    return snap


def test_the_snapshot_agrees_with_the_coordinator(engine: Engine) -> None:
    clock = Clock()
    coordinator = Coordinator(engine, KEY, clock=clock)
    coordinator.register(
        StageGraph.build([Stage("a"), Stage("b"), Stage("c"), Stage("d", upstream=("c",))]),
        CoordinatorOptions(checkpoint_timeout_s=60),
    )
    a = coordinator.start_attempt("a").epoch
    b = coordinator.start_attempt("b").epoch
    c = coordinator.start_attempt("c").epoch
    snap = assert_agrees(coordinator, clock)
    assert snap.stages["a"].lifecycle is StageLifecycle.RUNNING
    assert snap.stages["d"].lifecycle is StageLifecycle.NOT_STARTED

    eager_a = finish(coordinator, "a", a)  # pending: waits for b and c
    snap = assert_agrees(coordinator, clock)
    assert snap.stages["a"].first_candidate_id == eager_a
    assert snap.final_checkpoint_idle("a", a, clock.now)
    assert [cid for cid, _ in snap.pending] == [eager_a]

    # Aborted: no candidate left, ensure_final_checkpoint has work.
    assert eager_a is not None and coordinator.abort(eager_a, "test")
    snap = assert_agrees(coordinator, clock)
    assert snap.final_checkpoint_work("a", clock.now)
    replacement = coordinator.ensure_final_checkpoint("a")
    assert replacement is not None
    assert assert_agrees(coordinator, clock).final_checkpoint_idle("a", a, clock.now)

    # Timed out: write work for every waiter.
    clock.now += 61
    snap = assert_agrees(coordinator, clock)
    assert snap.timed_out(clock.now) == [replacement]
    coordinator.expire_timed_out()

    # A savepoint in progress: a finished stage waits for it (no work, nothing closable).
    savepoint = coordinator.request_stop(StopMode.SAVEPOINT, "test").savepoint_id
    eager_b = finish(coordinator, "b", b)
    assert eager_b is None  # b waits for the savepoint
    snap = assert_agrees(coordinator, clock)
    assert snap.stop is not None and snap.stop.savepoint_id == savepoint
    assert snap.final_checkpoint_idle("b", b, clock.now)
    assert snap.resume_idle("c", c)

    # The savepoint completes: a (finished before it) may close on it; b finished after it
    # was triggered (threshold savepoint + 1) and waits for the resume's checkpoint.
    coordinator.record_batch("c", c)
    snap = assert_agrees(coordinator, clock)
    assert snap.closable_checkpoint("a") == savepoint
    assert snap.closable_checkpoint("b") is None
    assert snap.final_checkpoint_idle("b", b, clock.now)  # suspended: nothing to trigger

    coordinator.close("a", a, savepoint)
    snap = assert_agrees(coordinator, clock)
    assert snap.stages["a"].closed_checkpoint_id == savepoint
    assert not snap.closed_idle("a")


def test_an_unregistered_pipeline_is_an_error(engine: Engine) -> None:
    with pytest.raises(UnknownPipelineError, match="not registered"):
        Coordinator(engine, "nobody").waiting_snapshot()
