"""A batch boundary reads the stage row and the latest stop request in one statement (the
boundary read, ``store.boundary``); the
outcome's stop is the one after the boundary: a savepoint the boundary completes shows its stop
COMPLETED (the transition's cached stop is forgotten when it writes one), on SQLite and
PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StopMode, StopState
from airflow_finalckpt.core.views import StageRow, StopRequest
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import boundary as b
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.reads import StoreReader
from airflow_finalckpt.store.repository import CoordinationStore


def stage_row_and_stop(rows: StoreReader, stage_id: str) -> tuple[StageRow, StopRequest | None]:
    read = b.read_boundary(rows.conn, rows.key, stage_id, ())
    assert read is not None
    return r.stage_row(read.row), b.stop_of(read.row)


def test_batch_outcome_shows_the_stop_after_the_boundary(store_url: str, tmp_path: Path) -> None:
    engine = make_engine(store_url)
    coord = Coordinator(engine, "stop", writer=CheckpointStorage(str(tmp_path / "ck")))
    coord.register(StageGraph.from_edges(["a", "b"], []))
    a = coord.start_attempt("a", total_splits=4)
    coord.start_attempt("b", total_splits=4)
    assert coord.record_batch("a", a.epoch, finished_splits=["a0"]).stop is None
    with CoordinationStore(engine, "stop").read() as rows:
        row, stop = stage_row_and_stop(rows, "a")
    assert stop is None and row.progress.finished_splits == {"a0"}
    first = coord.request_stop(StopMode.DRAIN, "bob")
    out = coord.record_batch("a", a.epoch, finished_splits=["a1"])
    assert out.stop is not None and out.stop.request_id == first.request_id
    assert out.stop.mode is StopMode.DRAIN and out.stop.requested_by == "bob"
    with CoordinationStore(engine, "stop").read() as rows:
        row, stop = stage_row_and_stop(rows, "b")
        assert stop == rows.latest_stop() and row.stage_id == "b"
    engine.dispose()


def test_a_boundary_completing_the_savepoint_shows_its_stop_completed(
    store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(store_url)
    coord = Coordinator(engine, "sp", writer=CheckpointStorage(str(tmp_path / "ck")))
    coord.register(StageGraph.from_edges(["a", "b"], []))
    a = coord.start_attempt("a", total_splits=4)
    b = coord.start_attempt("b", total_splits=4)
    stop = coord.request_stop(StopMode.SAVEPOINT, "alice")
    assert stop.savepoint_id is not None
    out = coord.record_batch("a", a.epoch, finished_splits=["a0"])
    assert out.acked == (stop.savepoint_id,) and out.stop is not None
    assert out.stop.state is StopState.REQUESTED
    out = coord.record_batch("b", b.epoch, finished_splits=["b0"])
    assert out.completed == (stop.savepoint_id,)
    assert out.stop is not None and out.stop.state is StopState.COMPLETED
    assert out.stop.finished_at is not None
    engine.dispose()
