"""What a completed checkpoint records of a stage finished before it was triggered (metadata
v2): the flag, its end_of_data, watermark and finished split count, no split ids; counted by
the database from the final snapshot, also when the stage declared no split total."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointState,
    EndOfData,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.core.restore import StageAction, plan_restore
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import upgrade


def test_a_finished_stage_is_recorded_as_a_flag_with_its_count(
    store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(store_url)
    upgrade(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, "flag", writer=storage)
    coord.register(StageGraph.from_edges(["a", "b", "c"], [("a", "b")]))
    a = coord.start_attempt("a")  # no declared split total
    eod = EndOfData(manifest=["out/a/0", "out/a/1"], watermark=77)
    coord.finish(
        "a",
        a.epoch,
        StageSnapshot(finished_splits=frozenset({"p1", "p2", "p3"}), watermark=77, end_of_data=eod),
    )
    c = coord.start_attempt("c", total_splits=5)
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    coord.record_batch("c", c.epoch, finished_splits=["x"])
    info = coord.checkpoint(cid)
    assert info.metadata_path is not None
    record, version = storage.read_checkpoint_versioned(info.metadata_path)
    assert version == 2
    stage = record.stages["a"]
    assert stage.status is StageStatus.FULLY_FINISHED
    assert stage.finished_splits == frozenset() and stage.finished_count == 3
    assert stage.end_of_data is not None and stage.end_of_data.manifest == eod.manifest
    assert stage.watermark == 77
    assert record.stages["c"].finished_splits == {"x"}
    assert record.stages["b"].status is StageStatus.NOT_STARTED
    engine.dispose()


class DecodeSpy:
    """The engine's JSON deserializer, recording the texts it decodes while ``watching``."""

    def __init__(self) -> None:
        self.watching = False
        self.decoded: list[str] = []

    def __call__(self, data: str | bytes) -> Any:
        text = data if isinstance(data, str) else bytes(data).decode()
        if self.watching:
            self.decoded.append(text)
        return json.loads(text)


def test_completion_never_decodes_a_finished_stage_split_ids(
    store_url: str, tmp_path: Path
) -> None:
    """Every JSON text the database hands back while a checkpoint completes is recorded: none
    holds the split ids of the stage that finished before the trigger.
    """
    spy = DecodeSpy()
    engine = make_engine(store_url, json_deserializer=spy)
    upgrade(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, "flag", writer=storage)
    coord.register(StageGraph.from_edges(["a", "c"], []))
    a = coord.start_attempt("a", total_splits=300)
    splits = frozenset(f"a-split-{k:04d}" for k in range(300))
    coord.finish("a", a.epoch, StageSnapshot(finished_splits=splits, end_of_data=EndOfData()))
    c = coord.start_attempt("c", total_splits=5)
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    spy.watching = True
    outcome = coord.record_batch("c", c.epoch, finished_splits=["c-split-1"])
    spy.watching = False
    assert cid in outcome.completed
    assert spy.decoded, "the spy saw no JSON: it is not the engine's deserializer"
    assert any("c-split-1" in text for text in spy.decoded)  # it sees what is read
    assert not [text for text in spy.decoded if "a-split-" in text]
    record = storage.read_checkpoint(coord.checkpoint(cid).metadata_path or "")
    assert record.stages["a"].finished_count == 300
    engine.dispose()


def _pipeline(store_url: str, tmp_path: Path, key: str) -> tuple[Coordinator, CheckpointStorage]:
    engine = make_engine(store_url)
    upgrade(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    return Coordinator(engine, key, writer=storage), storage


GRAPH = StageGraph.from_edges(["a", "b", "s"], [("a", "b")])


def test_a_stage_started_after_the_trigger_is_recorded_not_started(
    store_url: str, tmp_path: Path
) -> None:
    """a finishes while its sibling s runs: the eager checkpoint waits for s; meanwhile b
    (downstream of a) starts and records a batch. The checkpoint records b NOT_STARTED with
    nothing (its batch is past the cut), so it restores; it used to record b NOT_STARTED with
    b's finished splits, which restore refuses.
    """
    coord, storage = _pipeline(store_url, tmp_path, "late")
    coord.register(GRAPH)
    a = coord.start_attempt("a", total_splits=1)
    s = coord.start_attempt("s", total_splits=3)
    done = coord.finish(
        "a", a.epoch, StageSnapshot(finished_splits=frozenset({"x"}), end_of_data=EndOfData())
    )
    cid = done.eager_checkpoint_id
    assert cid is not None
    b = coord.start_attempt("b", total_splits=2)
    coord.record_batch("b", b.epoch, finished_splits=["b1"])
    coord.record_batch("s", s.epoch, finished_splits=["s1"])
    info = coord.checkpoint(cid)
    assert info.metadata_path is not None, info
    record = storage.read_checkpoint(info.metadata_path)
    assert record.stages["b"].status is StageStatus.NOT_STARTED
    assert record.stages["b"].finished_splits == frozenset()
    plan = plan_restore(record, GRAPH, pipeline_key="late")
    assert plan.stage("b").action is StageAction.FRESH
    assert plan.stage("s").finished_splits == {"s1"}


def test_restored_progress_changed_after_the_trigger_aborts_the_checkpoint(
    store_url: str, tmp_path: Path
) -> None:
    """b restored PARTIALLY_FINISHED and not started again is in the plan with its restored
    progress; if it starts and records a batch before the checkpoint completes, that progress
    is gone (its new transaction is not in the checkpoint): the checkpoint is aborted, the next
    one asks b and completes.
    """
    coord, storage = _pipeline(store_url, tmp_path, "moved")
    coord.register(GRAPH)
    a = coord.start_attempt("a", total_splits=1)
    coord.finish(
        "a", a.epoch, StageSnapshot(finished_splits=frozenset({"x"}), end_of_data=EndOfData())
    )
    b = coord.start_attempt("b", total_splits=3)
    s = coord.start_attempt("s", total_splits=3)
    first = coord.trigger(TriggerReason.MANUAL)
    assert first is not None
    coord.record_batch("b", b.epoch, finished_splits=["b1"])
    coord.record_batch("s", s.epoch, finished_splits=["s1"])
    source = coord.checkpoint(first).metadata_path
    assert source is not None
    record = storage.read_checkpoint(source)
    assert record.stages["b"].status is StageStatus.PARTIALLY_FINISHED
    coord.start_pipeline(GRAPH, record=record, source=source)  # b, s: NOT_STARTED, restored
    s = coord.start_attempt("s", total_splits=3)
    cid = coord.trigger(TriggerReason.MANUAL)  # waits for s only; b is recorded as restored
    assert cid is not None
    b = coord.start_attempt("b", total_splits=3)
    coord.record_batch("b", b.epoch, finished_splits=["b2"])
    coord.record_batch("s", s.epoch, finished_splits=["s2"])
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.ABORTED, info
    assert info.failure_reason is not None and "'b' started work after" in info.failure_reason
    nxt = coord.trigger(TriggerReason.MANUAL)
    assert nxt is not None
    coord.record_batch("b", b.epoch, finished_splits=["b3"])
    coord.record_batch("s", s.epoch, finished_splits=["s3"])
    assert coord.checkpoint(nxt).state is CheckpointState.COMPLETED


def test_a_stage_restored_fully_finished_keeps_its_count_in_later_checkpoints(
    store_url: str, tmp_path: Path
) -> None:
    """Metadata v2 keeps no split ids of a fully finished stage, so after a restore its final
    snapshot has none: later checkpoints count it from its declared splits minus unread ones.
    """
    coord, storage = _pipeline(store_url, tmp_path, "count")
    coord.register(GRAPH)
    a = coord.start_attempt("a", total_splits=4)
    drained = EndOfData(drain=True, unread_splits=1)
    splits = frozenset({"x1", "x2", "x3"})
    coord.finish("a", a.epoch, StageSnapshot(finished_splits=splits, end_of_data=drained))
    first = coord.trigger(TriggerReason.MANUAL)
    assert first is not None
    source = coord.checkpoint(first).metadata_path
    assert source is not None
    record = storage.read_checkpoint(source)
    assert record.stages["a"].finished_count == 3
    coord.start_pipeline(GRAPH, record=record, source=source)
    assert coord.stage("a").final_snapshot is not None
    assert coord.stage("a").final_snapshot.finished_splits == frozenset()  # type: ignore[union-attr]
    later = coord.trigger(TriggerReason.MANUAL)
    assert later is not None
    path = coord.checkpoint(later).metadata_path
    assert path is not None
    assert storage.read_checkpoint(path).stages["a"].finished_count == 3
