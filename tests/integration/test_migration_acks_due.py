"""Migration 0004 (who must acknowledge in ``finalckpt_acks_due``) on a pipeline that runs across
the upgrade, on SQLite and PostgreSQL: a pending checkpoint with some acknowledgements, written
as revision 0003's coordinator wrote it (the plan's JSON ``to_ack``, no due rows), is upgraded
and then acknowledged, finished and completed through the current code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.store import migrate
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

KEY = "mid-run"
STAGES = ("a", "b", "c")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    eng = make_engine(url)
    yield eng
    eng.dispose()


def progress(sid: str, done: int) -> dict[str, object]:
    """A stage's progress JSON as the 0003 coordinator stored it (StageSnapshot as JSON)."""
    return StageSnapshot(finished_splits=frozenset(f"{sid}-{k}" for k in range(done))).model_dump(
        mode="json"
    )


def seed_rev_0003(engine: Engine) -> None:
    """Pipeline a|b|c, all RUNNING; checkpoint 1 PENDING waits for a, b, c and a answered it."""
    graph = StageGraph.build(Stage(sid, ()) for sid in STAGES)
    now = time.time()
    plan = {  # the 0003 plan, split ids included
        "to_trigger": list(STAGES),
        "to_ack": list(STAGES),
        "fully_finished": [],
        "not_started": [],
        "partially_finished": {sid: [f"{sid}-0"] for sid in STAGES},
        "statuses": {sid: "PARTIALLY_FINISHED" for sid in STAGES},
    }
    with engine.begin() as conn:
        conn.execute(
            t.pipelines.insert().values(
                pipeline_key=KEY,
                graph=graph.to_dict(),
                fingerprint=graph.fingerprint,
                next_checkpoint_id=2,
                retain_checkpoints=3,
                checkpoint_timeout_s=600.0,
                created_at=now,
                updated_at=now,
            )
        )
        for sid in STAGES:
            conn.execute(
                t.stages.insert().values(
                    pipeline_key=KEY,
                    stage_id=sid,
                    lifecycle="RUNNING",
                    epoch=1,
                    total_splits=4,
                    progress=progress(sid, 2 if sid == "a" else 1),
                    updated_at=now,
                )
            )
        conn.execute(
            t.checkpoints.insert().values(
                pipeline_key=KEY,
                checkpoint_id=1,
                kind="checkpoint",
                reason="periodic",
                state="PENDING",
                plan=plan,
                acks_pending=2,
                triggered_at=now,
            )
        )
        conn.execute(
            t.acks.insert().values(
                pipeline_key=KEY,
                checkpoint_id=1,
                stage_id="a",
                epoch=1,
                by_finish=False,
                snapshot=progress("a", 2),
                acked_at=now,
            )
        )


def due_rows(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(select(t.acks_due.c.checkpoint_id, t.acks_due.c.stage_id)).all()
    return sorted((int(cid), str(sid)) for cid, sid in rows)


def continue_after_upgrade(engine: Engine) -> None:
    """b finishes, c and a reach batch boundaries: both checkpoints complete, b closes."""
    coord = Coordinator(engine, KEY)
    assert coord.pending_for("b") == [1] and coord.pending_for("a") == []
    final = StageSnapshot(
        finished_splits=frozenset({"b-1", "b-2", "b-3"}),
        end_of_data=EndOfData(manifest=["b/p"]),
        pending_transactions=(SinkTransaction(sink_id="k", txn_id="b-t"),),
    )
    fin = coord.finish("b", 1, final)
    eager = fin.eager_checkpoint_id
    assert eager == fin.threshold == 2  # 1 was periodic: a new eager checkpoint
    assert due_rows(engine) == [(1, "c"), (2, "a"), (2, "c")]
    assert coord.record_batch("c", 1, finished_splits=["c-1"]).completed == (1,)
    assert coord.checkpoint(1).state is CheckpointState.COMPLETED
    assert due_rows(engine) == [(2, "a")]  # c answered 2 at the same boundary
    assert coord.record_batch("a", 1, finished_splits=["a-2"]).completed == (2,)
    assert due_rows(engine) == []
    assert coord.closable_checkpoint("b") == 2
    for txn in coord.committable_transactions("b"):
        coord.mark_committed("b", 1, txn.sink_id, txn.txn_id)
    assert coord.close("b", 1, 2) == []
    assert coord.stage("b").lifecycle is StageLifecycle.CLOSED
    assert coord.checkpoint(2).plan.statuses["b"] is StageStatus.FULLY_FINISHED
    # the periodic trigger of the new code plans from the migrated rows as well
    again = coord.trigger(TriggerReason.PERIODIC)
    assert again == 3 and due_rows(engine) == [(3, "a"), (3, "c")]


def test_upgrade_keeps_a_running_pipeline_running(engine: Engine) -> None:
    migrate.upgrade(engine, "0003")
    seed_rev_0003(engine)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    # the pending checkpoint's to_ack minus its acknowledgements
    assert due_rows(engine) == [(1, "b"), (1, "c")]
    continue_after_upgrade(engine)


def test_downgrade_and_upgrade_again_keep_it_running(engine: Engine) -> None:
    """A downgrade drops the table (the plans keep to_ack); the upgrade rebuilds it."""
    migrate.upgrade(engine, "0003")
    seed_rev_0003(engine)
    migrate.upgrade(engine)
    migrate.downgrade(engine, "0003")
    with engine.connect() as conn:
        assert conn.execute(select(t.acks.c.stage_id)).scalars().all() == ["a"]
    migrate.upgrade(engine)
    assert due_rows(engine) == [(1, "b"), (1, "c")]
    continue_after_upgrade(engine)
