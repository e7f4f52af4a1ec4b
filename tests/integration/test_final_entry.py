"""``finalckpt_stages.final_entry``: a finished stage's metadata v2 entry, encoded once when it
finishes, assembled by every later completion instead of encoding the stage again. The
``_metadata`` written that way is byte for byte the one the encoding path writes (same canonical
JSON, same checksum), through the real coordinator on SQLite and PostgreSQL: closed stages,
FINISHED stages whose pending transactions the trigger stamps, strings that look like the
entry's own keys, and stages finished without the column (NULL: encoded as before).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core import transitions as rules
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata import codec, dump_metadata
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    EndOfData,
    SinkTransaction,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.repository import CoordinationStore

KEY = "entries"
#: Text inside a manifest that looks like the entry's structure (quotes, the splice marker).
TRICKY = 'out/"pending_transactions":[],"watermark":1}/ü\\'


class ComparingStorage(CheckpointStorage):
    """Checkpoint storage that also encodes every record the old way, without the stored
    entries, and keeps both byte strings (and which stages the completion pre-encoded).
    """

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.written: list[tuple[bytes, bytes, set[str]]] = []

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        used = set(codec._ENCODED.get() or {})
        with codec.encoded_finished({}):
            encoded_afresh = dump_metadata(record)
        path, size = super().write_checkpoint(record, replace_orphan=replace_orphan)
        with open(path, "rb") as handle:
            self.written.append((handle.read(), encoded_afresh, used))
        return path, size


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def final(sid: str, manifest: list[str], **eod: Any) -> StageSnapshot:
    return StageSnapshot(
        finished_splits=frozenset({f"{sid}-0", f"{sid}-1"}),
        watermark=123,
        end_of_data=EndOfData(manifest=manifest, watermark=123, **eod),
    )


def txn(sid: str, n: int) -> SinkTransaction:
    return SinkTransaction(
        sink_id="sink", txn_id=f"{sid}.{n}", payload={"z": [1, {"é": None}], "a": "x"}
    )


def entries(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.stages.c.stage_id, t.stages.c.final_entry).where(
                t.stages.c.pipeline_key == KEY
            )
        ).all()
    return {str(sid): entry for sid, entry in rows}


def test_completions_from_stored_entries_write_the_same_bytes(
    engine: Engine, tmp_path: Path
) -> None:
    storage = ComparingStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["closed", "fin", "odd", "run", "new"], []))
    epochs = {
        sid: coord.start_attempt(sid, total_splits=2).epoch
        for sid in ("closed", "fin", "odd", "run")
    }
    for sid in ("closed", "fin", "odd", "run"):
        coord.record_batch(
            sid, epochs[sid], finished_splits=[f"{sid}-0"], transactions=(txn(sid, 1),)
        )
    coord.finish("closed", epochs["closed"], final("closed", ["out/closed/0"]))
    coord.finish("fin", epochs["fin"], final("fin", ["out/fin/0", "out/fin/1"]))
    coord.finish("odd", epochs["odd"], final("odd", [TRICKY], drain=True, unread_splits=1))
    # the stage that runs answers the eager checkpoint(s) the finishes triggered
    coord.record_batch(
        "run", epochs["run"], finished_splits=["run-1"], transactions=(txn("run", 2),)
    )
    first = coord.closable_checkpoint("closed")
    assert first is not None
    for committable in coord.committable_transactions("closed"):
        coord.mark_committed("closed", epochs["closed"], committable.sink_id, committable.txn_id)
    coord.close("closed", epochs["closed"], first)
    stored = entries(engine)
    assert stored["closed"] and stored["fin"] and stored["odd"]
    assert stored["run"] is None and stored["new"] is None
    assert '"pending_transactions":[]' in stored["fin"]  # spliced in at each completion

    # the ends read from the entries are the ends read without them
    with CoordinationStore(engine, KEY).read() as rows:
        found = rows.finished_stages()
    texts, built = found.entries, found.records
    assert set(texts) == {"closed", "fin", "odd"} and found.ends == {}
    with engine.begin() as conn:
        conn.execute(update(t.stages).values(final_entry=None))
    with CoordinationStore(engine, KEY).read() as rows:
        without = rows.finished_stages()
    assert without.entries == {} and without.records == {}
    assert set(without.ends) == set(built)
    for sid, stage in built.items():  # the records a completion builds without the entries
        assert stage == rules.finished_stage_record(sid, without.ends[sid], ())
    with engine.begin() as conn:
        for sid, text in texts.items():
            conn.execute(
                update(t.stages).where(t.stages.c.stage_id == sid).values(final_entry=text)
            )

    # a checkpoint recording the finished stages from their stored entries alone
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    coord.record_batch(
        "run", epochs["run"], finished_splits=["run-2"], transactions=(txn("run", 3),)
    )
    # a stage finished by a version without the column: encoded as before, beside the others
    with engine.begin() as conn:
        conn.execute(update(t.stages).where(t.stages.c.stage_id == "odd").values(final_entry=None))
    again = coord.trigger(TriggerReason.MANUAL)
    assert again is not None
    coord.record_batch("run", epochs["run"], finished_splits=["run-3"])

    by_id = {
        record_id: written for record_id, written in zip(ids(coord), storage.written, strict=True)
    }
    file_bytes, afresh, used = by_id[cid]
    assert used == {"closed", "fin", "odd"}
    assert file_bytes == afresh
    record = storage.read_checkpoint(coord.checkpoint(cid).metadata_path or "")
    fin = record.stages["fin"]
    assert fin.status is StageStatus.FULLY_FINISHED and fin.finished_count == 2
    assert [x.txn_id for x in fin.pending_transactions] == ["fin.1"]
    assert fin.pending_transactions[0].checkpoint_id is not None  # stamped by a trigger
    assert record.stages["odd"].end_of_data is not None
    assert record.stages["odd"].end_of_data.manifest == [TRICKY]
    file_bytes, afresh, used = by_id[again]
    assert used == {"closed", "fin"}
    assert file_bytes == afresh


def ids(coord: Coordinator) -> list[int]:
    """Ids of the completed checkpoints, in the order they were written."""
    return sorted(c.checkpoint_id for c in coord.checkpoints() if c.completed_at is not None)
