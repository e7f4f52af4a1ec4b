"""What a completed checkpoint records of a stage finished before it was triggered (metadata
v2): the flag, its end_of_data, watermark and finished split count, no split ids; counted by
the database from the final snapshot, also when the stage declared no split total."""

from __future__ import annotations

from pathlib import Path

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
