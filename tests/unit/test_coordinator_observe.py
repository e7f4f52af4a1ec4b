"""The coordinator's checkpoint events (``core.observe``), the source of the checkpoint metrics:
acknowledgement lag per stage (and which acknowledgement was the last), duration from trigger
to completion, ``_metadata`` and state bytes, aborts; reported only once the transition
committed. Real coordination store (SQLite), fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from airflow_finalckpt.coordination import Coordinator, CoordinatorOptions
from airflow_finalckpt.core import observe
from airflow_finalckpt.core.errors import StaleEpochError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    EndOfData,
    StageSnapshot,
    StateHandle,
    TriggerReason,
)
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

METADATA_BYTES = 1234


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Writer:
    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        return f"memory://chk-{record.checkpoint_id}/_metadata", METADATA_BYTES

    def discard_checkpoint(self, metadata_path: str) -> None:
        pass


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    eng = make_engine(sqlite_url)
    ensure_schema(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def events() -> Iterator[list[observe.CheckpointEvent]]:
    seen: list[observe.CheckpointEvent] = []
    remove = observe.add_listener(seen.append)
    yield seen
    remove()


def handle(name: str, size: int) -> StateHandle:
    return StateHandle(name=name, path=f"state/{name}", size=size, sha256="0" * 64)


def test_ack_lag_duration_and_sizes(engine: Engine, events: list[observe.CheckpointEvent]) -> None:
    clock = Clock()
    coord = Coordinator(engine, "observed", writer=Writer(), clock=clock)
    graph = StageGraph.build([Stage("a", ()), Stage("b", ())])
    coord.register(graph, CoordinatorOptions(3, 600.0))
    epochs = {sid: coord.start_attempt(sid).epoch for sid in ("a", "b")}
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    assert events == []  # triggering reports nothing

    clock.now += 2.5
    coord.record_batch("a", epochs["a"], finished_splits=["s1"], state=[handle("a-open", 700)])
    clock.now += 4.0  # b acknowledges 6.5 s after the trigger, with its finish
    coord.finish(
        "b",
        epochs["b"],
        StageSnapshot(
            state=(handle("b-state", 300),),
            end_of_data=EndOfData(drain=False, manifest=["part-0"]),
        ),
    )

    acks = [e for e in events if isinstance(e, observe.CheckpointAcknowledged)]
    first = [e for e in acks if e.checkpoint_id == cid]
    assert [(e.stage_id, e.lag_s, e.last, e.by_finish) for e in first] == [
        ("a", 2.5, False, False),
        ("b", 6.5, True, True),
    ]
    done = [e for e in events if isinstance(e, observe.CheckpointCompleted)]
    assert done[0].checkpoint_id == cid
    assert done[0].duration_s == 6.5
    assert done[0].metadata_bytes == METADATA_BYTES
    assert done[0].state_bytes == 700  # a's open state; finished b carries no state
    assert (done[0].kind, done[0].reason, done[0].stages) == ("checkpoint", "manual", 2)


def test_no_event_for_a_rolled_back_transition(
    engine: Engine, events: list[observe.CheckpointEvent]
) -> None:
    coord = Coordinator(engine, "rolled-back", writer=Writer(), clock=Clock())
    coord.register(StageGraph.build([Stage("a", ())]), CoordinatorOptions(3, 600.0))
    coord.start_attempt("a")
    stale = 0  # never a valid epoch: the acknowledgement is refused and rolled back
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    with pytest.raises(StaleEpochError):
        coord.acknowledge(cid, "a", stale)
    assert events == []


def test_aborted_checkpoints_are_reported(
    engine: Engine, events: list[observe.CheckpointEvent]
) -> None:
    clock = Clock()
    coord = Coordinator(engine, "aborted", writer=Writer(), clock=clock)
    coord.register(StageGraph.build([Stage("a", ())]), CoordinatorOptions(3, 10.0))
    coord.start_attempt("a")
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    clock.now += 11
    assert coord.expire_timed_out() == [cid]
    assert [(type(e).__name__, e.checkpoint_id) for e in events] == [("CheckpointAborted", cid)]
    assert isinstance(events[0], observe.CheckpointAborted) and "timed out" in events[0].reason


def test_a_failing_listener_never_fails_the_checkpoint(engine: Engine) -> None:
    def broken(event: observe.CheckpointEvent) -> None:
        raise RuntimeError("metrics backend down")

    remove = observe.add_listener(broken)
    try:
        coord = Coordinator(engine, "broken", writer=Writer(), clock=Clock())
        coord.register(StageGraph.build([Stage("a", ())]), CoordinatorOptions(3, 600.0))
        epoch = coord.start_attempt("a").epoch
        cid = coord.trigger(TriggerReason.MANUAL)
        assert cid is not None
        coord.record_batch("a", epoch, finished_splits=["s1"])
        assert coord.checkpoint(cid).is_completed
    finally:
        remove()
