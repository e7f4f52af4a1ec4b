"""What a completed checkpoint records of a stage finished before it was triggered (metadata
v2): the flag, its end_of_data, watermark and finished split count, no split ids; counted by
the database from the final snapshot, also when the stage declared no split total."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData, StageSnapshot, StageStatus, TriggerReason
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
