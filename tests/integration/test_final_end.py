"""``finalckpt_stages.final_end``: what a completion records of a finished stage, written with its
final snapshot, filled by migration 0004 for stages finished before it, and read through JSON
paths of the final snapshot for a row without it (written by a version that did not have it),
on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select, update

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    EndOfData,
    FinishedStageEnd,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import migrate
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.repository import CoordinationStore

EOD = EndOfData(manifest=["out/a/0", "out/a/1"], watermark=77, finished_at_checkpoint=1)
FINAL = StageSnapshot(
    finished_splits=frozenset({"a-split-1", "a-split-2", "a-split-3"}),
    watermark=77,
    end_of_data=EOD,
)


def final_end_column(engine: Engine, key: str, stage_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(t.stages.c.final_end).where(
                t.stages.c.pipeline_key == key, t.stages.c.stage_id == stage_id
            )
        ).scalar_one()


def finished_ends(engine: Engine, key: str) -> dict[str, FinishedStageEnd]:
    """The ends a completion reads of finished stages without a stored entry."""
    with CoordinationStore(engine, key).read() as rows:
        found = rows.finished_stages()
    assert not found.records  # no final_entry: read from final_end, else the JSON paths
    return found.ends


def test_finish_writes_final_end_and_a_row_without_it_reads_the_same(
    store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(store_url)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, "ends", writer=storage)
    coord.register(StageGraph.from_edges(["a", "b"], []))
    a = coord.start_attempt("a", total_splits=3)
    coord.finish("a", a.epoch, FINAL)
    stored = final_end_column(engine, "ends", "a")
    assert stored["finished"] == 3 and stored["watermark"] == 77
    assert EndOfData.model_validate(stored["end_of_data"]).manifest == EOD.manifest
    assert "a-split-1" not in str(stored)  # a narrow value: no split ids
    assert final_end_column(engine, "ends", "b") is None  # not finished
    with engine.begin() as conn:  # as a version before final_entry (0005) left it
        conn.execute(update(t.stages).where(t.stages.c.stage_id == "a").values(final_entry=None))
    with_column = finished_ends(engine, "ends")
    assert set(with_column) == {"a"} and with_column["a"].finished_count == 3
    assert with_column["a"].end_of_data is not None
    assert with_column["a"].end_of_data.manifest == EOD.manifest
    # as a version without the column left it: read from the final snapshot's JSON paths
    with engine.begin() as conn:
        conn.execute(update(t.stages).where(t.stages.c.stage_id == "a").values(final_end=None))
    assert finished_ends(engine, "ends") == with_column
    b = coord.start_attempt("b", total_splits=2)
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    coord.record_batch("b", b.epoch, finished_splits=["b-0"])
    info = coord.checkpoint(cid)
    assert info.metadata_path is not None
    stage = storage.read_checkpoint(info.metadata_path).stages["a"]
    assert stage.status is StageStatus.FULLY_FINISHED and stage.finished_count == 3
    assert stage.end_of_data is not None and stage.end_of_data.manifest == EOD.manifest
    engine.dispose()


def test_migration_0004_fills_final_end_of_finished_stages(store_url: str) -> None:
    engine = make_engine(store_url)
    migrate.downgrade(engine, "0003")
    graph = StageGraph.build(Stage(sid, ()) for sid in ("a", "b"))
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            t.pipelines.insert().values(
                pipeline_key="old",
                graph=graph.to_dict(),
                fingerprint=graph.fingerprint,
                next_checkpoint_id=2,
                retain_checkpoints=3,
                checkpoint_timeout_s=600.0,
                created_at=now,
                updated_at=now,
            )
        )
        final = FINAL.model_dump(mode="json")
        for sid, lifecycle, snapshot in (("a", "CLOSED", final), ("b", "RUNNING", None)):
            conn.execute(
                t.stages.insert().values(
                    pipeline_key="old",
                    stage_id=sid,
                    lifecycle=lifecycle,
                    epoch=1,
                    total_splits=3,
                    progress=snapshot or StageSnapshot().model_dump(mode="json"),
                    final_snapshot=snapshot,
                    finish_threshold=1 if snapshot else None,
                    updated_at=now,
                )
            )
    migrate.upgrade(engine)
    stored = final_end_column(engine, "old", "a")
    assert stored == {"end_of_data": final["end_of_data"], "watermark": 77, "finished": 3}
    assert final_end_column(engine, "old", "b") is None
    ends = finished_ends(engine, "old")
    assert set(ends) == {"a"} and ends["a"].finished_count == 3 and ends["a"].watermark == 77
    engine.dispose()
