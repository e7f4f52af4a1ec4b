"""The trigger's plan read (``StoreReader.plan_lifecycles``): every stage's lifecycle and which
unfinished stages hold finished splits, counted by the database in the progress JSON (SQLite's
and PostgreSQL's JSON functions), plans what the progress rows themselves plan. And the
completion's read of the stages that have not started (``unstarted_progress``), which decodes
no progress that is the empty one as written.
"""

from __future__ import annotations

from sqlalchemy import update

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core import transitions as rules
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    EndOfData,
    StageLifecycle,
    StageProgress,
    StageSnapshot,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan, calculate_plan, plan_of_lifecycles
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.reads_checkpoint import EMPTY_PROGRESS
from airflow_finalckpt.store.repository import CoordinationStore


def test_plan_lifecycles_plans_what_the_progress_rows_plan(store_url: str) -> None:
    engine = make_engine(store_url)
    coord = Coordinator(engine, "lifecycles")
    ids = ["done", "closed", "busy", "idle", "new", "late"]
    graph = StageGraph.from_edges(ids, [("busy", "late")])
    coord.register(graph)
    epochs = {sid: coord.start_attempt(sid, total_splits=2).epoch for sid in ids[:4]}
    coord.record_batch("busy", epochs["busy"], finished_splits=["b-0"])
    coord.record_batch("idle", epochs["idle"])  # a batch boundary without a finished split
    for sid in ("done", "closed"):
        snap = StageSnapshot(finished_splits=frozenset({f"{sid}-0"}), end_of_data=EndOfData())
        coord.finish(sid, epochs[sid], snap)
    coord.record_batch("busy", epochs["busy"], finished_splits=["b-1"])
    coord.record_batch("idle", epochs["idle"])
    closable = coord.closable_checkpoint("closed")
    assert closable is not None
    coord.close("closed", epochs["closed"], closable)
    with CoordinationStore(engine, "lifecycles").read() as rows:
        lifecycles, with_splits = rows.plan_lifecycles()
    assert lifecycles == {
        "done": StageLifecycle.FINISHED,
        "closed": StageLifecycle.CLOSED,
        "busy": StageLifecycle.RUNNING,
        "idle": StageLifecycle.RUNNING,
        "new": StageLifecycle.NOT_STARTED,
        "late": StageLifecycle.NOT_STARTED,
    }
    assert with_splits == {"busy"}
    full = calculate_plan(
        graph,
        {
            sid: StageProgress(
                lifecycle=view.lifecycle,
                finished_splits=view.progress.finished_splits,
                total_splits=view.total_splits,
            )
            for sid, view in coord.stages().items()
        },
    )
    lean = plan_of_lifecycles(graph, lifecycles, with_splits)
    assert lean == CheckpointPlan.from_dict(full.to_dict(splits=False))
    assert rules.finished_unclosed(lean, lifecycles) == ["done"]
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    assert coord.checkpoint(cid).plan == lean
    engine.dispose()


def test_unstarted_progress_skips_only_the_empty_progress_text(store_url: str) -> None:
    """The database sends no JSON for a stage whose progress is the empty one as written; the
    same progress written in another key order, or a restored progress, is decoded.
    """
    engine = make_engine(store_url)
    coord = Coordinator(engine, "idle")
    coord.register(StageGraph.from_edges(["empty", "reordered", "restored", "busy"], []))
    coord.start_attempt("busy", total_splits=1)
    restored = StageSnapshot(finished_splits=frozenset({"r-0"}), watermark=3)
    reordered = dict(reversed(list(EMPTY_PROGRESS.model_dump(mode="json").items())))
    with engine.begin() as conn:
        for sid, progress in (
            ("restored", restored.model_dump(mode="json")),
            ("reordered", reordered),
        ):
            conn.execute(
                update(t.stages)
                .where(t.stages.c.pipeline_key == "idle", t.stages.c.stage_id == sid)
                .values(progress=progress)
            )
    with CoordinationStore(engine, "idle").read() as rows:
        idle = rows.unstarted_progress()
    assert set(idle) == {"empty", "reordered", "restored"}
    assert idle["empty"] is EMPTY_PROGRESS
    assert idle["reordered"] == EMPTY_PROGRESS
    assert idle["restored"] == restored
    engine.dispose()
