"""A fully finished stage restored from metadata v2 (a flag with a split count, no split ids)
still says how many splits it finished: the resume log line of its task ("stage ingest is
FINISHED with 20 finished splits", issue 25: it said 0) and later checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData, StageLifecycle, StageSnapshot
from airflow_finalckpt.core.views import StageView
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

SPLITS = [f"day-{i:02d}" for i in range(20)]


def _coordinator(url: str, storage: CheckpointStorage) -> Coordinator:
    engine = make_engine(url)
    ensure_schema(engine)
    return Coordinator(engine, "restored-count", writer=storage)


def test_a_restored_finished_stage_counts_its_splits(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = _coordinator(f"sqlite:///{tmp_path}/first.db", storage)
    graph = StageGraph.from_edges(["ingest", "enrich"], [("ingest", "enrich")])
    coord.register(graph)
    epoch = coord.start_attempt("ingest", total_splits=len(SPLITS)).epoch
    coord.record_batch("ingest", epoch, finished_splits=SPLITS)
    done = coord.finish("ingest", epoch, StageSnapshot(end_of_data=EndOfData(manifest=["p"])))
    assert done.eager_checkpoint_id is not None
    path = coord.checkpoint(done.eager_checkpoint_id).metadata_path
    assert path is not None
    record = storage.read_checkpoint(path)
    assert record.stages["ingest"].finished_count == len(SPLITS)
    assert not record.stages["ingest"].finished_splits  # v2: a flag with a count, no ids

    fresh = _coordinator(f"sqlite:///{tmp_path}/fresh.db", storage)
    fresh.start_pipeline(graph, record=record, source=path)
    view = fresh.stage("ingest")
    assert view.lifecycle is StageLifecycle.FINISHED
    assert not view.progress.finished_splits
    assert view.finished_count() == len(SPLITS)  # the log line said 0 here


def _view(lifecycle: StageLifecycle, total: int | None, unread: int = 0) -> StageView:
    final = StageSnapshot(end_of_data=EndOfData(unread_splits=unread))
    return StageView("s", lifecycle, 1, total, StageSnapshot(), None, final, None)


def test_finished_count_of_views() -> None:
    assert _view(StageLifecycle.CLOSED, 20).finished_count() == 20
    assert _view(StageLifecycle.FINISHED, 20, unread=5).finished_count() == 15  # drained
    assert _view(StageLifecycle.FINISHED, None).finished_count() is None
    assert _view(StageLifecycle.RUNNING, 20).finished_count() == 0  # running: its ids count
    running = StageView(
        "s",
        StageLifecycle.RUNNING,
        1,
        20,
        StageSnapshot(finished_splits=frozenset({"a"})),
        None,
        None,
        None,
    )
    assert running.finished_count() == 1
