"""Migration 0003 (checkpoint failure reason): existing aborts get their cause from their detail
text, on SQLite and PostgreSQL; a downgrade drops the column and keeps every row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.engine import make_engine

DETAILS = {
    1: ("ABORTED", "timed out after 600 s", "expired"),
    2: ("ABORTED", "declined by stage 'b': executor lost", "declined"),
    3: ("ABORTED", "subsumed by checkpoint 5", "subsumed"),
    4: ("ABORTED", "writing checkpoint metadata failed: EIO", "write_failed"),
    5: ("COMPLETED", None, None),
    6: ("ABORTED", "pipeline restored from /x/chk-1/_metadata", "restored"),
    7: ("ABORTED", "operator said so", "manual"),
    8: ("PENDING", None, None),
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    eng = make_engine(url)
    yield eng
    eng.dispose()


def test_upgrade_backfills_the_cause_of_existing_aborts(engine: Engine) -> None:
    migrate.upgrade(engine, "0002")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO finalckpt_pipelines (pipeline_key, graph, fingerprint, "
                "next_checkpoint_id, retain_checkpoints, checkpoint_timeout_s, created_at, "
                "updated_at) VALUES ('p', '{}', 'f', 9, 3, 600, 0, 0)"
            )
        )
        for cid, (state, detail, _) in DETAILS.items():
            conn.execute(
                text(
                    "INSERT INTO finalckpt_checkpoints (pipeline_key, checkpoint_id, kind, "
                    "reason, state, plan, acks_pending, triggered_at, failure_reason) VALUES "
                    "('p', :cid, 'checkpoint', 'manual', :state, '{}', 0, 0, :detail)"
                ),
                {"cid": cid, "state": state, "detail": detail},
            )
    migrate.upgrade(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT checkpoint_id, failure_kind, failure_reason FROM finalckpt_checkpoints")
        ).all()
    assert {int(cid): kind for cid, kind, _ in rows} == {
        cid: kind for cid, (_, _, kind) in DETAILS.items()
    }
    assert {int(cid): detail for cid, _, detail in rows} == {
        cid: detail for cid, (_, detail, _) in DETAILS.items()
    }

    migrate.downgrade(engine, "0002")
    with engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM finalckpt_checkpoints")).scalar()
    assert count == len(DETAILS)
    assert migrate.current_revision(engine) == "0002"
