"""A real v1 checkpoint (tests/fixtures/metadata/v1_pipeline, written by the coordinator before
metadata v2) restores, and restoring it or the same checkpoint rewritten as v2 gives identical
stage views, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata import dump_metadata, metadata_version
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.core.restore import StageAction
from airflow_finalckpt.core.views import StageView
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import upgrade

FIXTURE = Path(__file__).parent.parent / "fixtures" / "metadata" / "v1_pipeline"
KEY = "v1-fixture"
GRAPH = StageGraph.from_edges(
    ["ingest", "enrich", "windows", "side"], [("ingest", "enrich"), ("enrich", "windows")]
)


def restored_views(url: str, storage: CheckpointStorage, path: str) -> dict[str, StageView]:
    engine = make_engine(url)
    upgrade(engine)
    coord = Coordinator(engine, KEY, writer=storage)
    record = storage.read_checkpoint(path)
    outcome = coord.start_pipeline(GRAPH, record=record, source=path)
    assert outcome.restored is not None
    views = {sid: coord.stage(sid) for sid in GRAPH.stage_ids}
    engine.dispose()
    return views


def test_the_v1_fixture_restores_and_v2_gives_identical_views(
    store_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "checkpoints"
    shutil.copytree(FIXTURE, root)
    storage = CheckpointStorage(str(root))
    v1_path = storage.metadata_path(KEY, 2)
    v1_bytes = Path(v1_path).read_bytes()
    assert json.loads(v1_bytes)["version"] == 1 == metadata_version(v1_bytes)
    record = storage.read_checkpoint(v1_path)
    # the same checkpoint written again by today's writer, in a copy of the storage
    v2_root = tmp_path / "v2"
    shutil.copytree(FIXTURE, v2_root)
    (v2_root / KEY / "chk-2" / "_metadata").write_bytes(dump_metadata(record))
    v2_storage = CheckpointStorage(str(v2_root))
    v2_path = v2_storage.metadata_path(KEY, 2)
    assert metadata_version(Path(v2_path).read_bytes()) == 2

    from_v1 = restored_views(store_url, storage, v1_path)
    if store_url.startswith("sqlite"):
        second_url = store_url.replace("coordination.db", "coordination-v2.db")
    else:  # PostgreSQL: the same pipeline restored again, now from the v2 file
        second_url = store_url
    from_v2 = restored_views(second_url, v2_storage, v2_path)

    def comparable(view: StageView) -> tuple[object, ...]:
        return (view.lifecycle, view.progress, view.final_snapshot, view.finish_threshold)

    assert {s: comparable(v) for s, v in from_v1.items()} == {
        s: comparable(v) for s, v in from_v2.items()
    }
    ingest, enrich, side, windows = (from_v1[s] for s in ("ingest", "enrich", "side", "windows"))
    assert ingest.lifecycle is StageLifecycle.FINISHED
    assert ingest.final_snapshot is not None and ingest.final_snapshot.end_of_data is not None
    assert ingest.final_snapshot.end_of_data.manifest == ["data/ingest/part-0.json"]
    assert enrich.progress.finished_splits == {"day-01", "day-02"}
    assert [h.name for h in enrich.progress.state] == ["seen", "output:data/enrich/b0.json"]
    assert side.progress.watermark == 1_370_000_050_000
    assert windows.progress.finished_splits == frozenset() and not windows.progress.state
    # every state file the restored stages name is there and intact
    for view in (enrich, side):
        for h in view.progress.state:
            assert storage.read_state(KEY, h)


def test_the_v1_fixture_plans_skip_resume_and_fresh() -> None:
    from airflow_finalckpt.core.restore import plan_document, plan_restore

    storage = CheckpointStorage(str(FIXTURE))
    record = storage.read_checkpoint(storage.metadata_path(KEY, 2))
    plan = plan_restore(record, GRAPH, pipeline_key=KEY)
    actions = {sid: s.action for sid, s in plan.stages.items()}
    assert actions == {
        "ingest": StageAction.SKIP,
        "enrich": StageAction.RESUME,
        "side": StageAction.RESUME,
        "windows": StageAction.FRESH,
    }
    assert record.stages["ingest"].done_splits == 3
    # the dry-run document still counts what a skipped stage finished (no ids: metadata v2)
    doc = {s["stage_id"]: s for s in plan_document(plan)["stages"]}
    assert (doc["ingest"]["finished_splits"], doc["ingest"]["finished_count"]) == ([], 3)
    assert doc["enrich"]["finished_count"] == 2
    assert [t.txn_id for t in plan.stage("ingest").pending_transactions] == ["ingest.e1.t0"]
