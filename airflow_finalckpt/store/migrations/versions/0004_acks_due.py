"""Acknowledgement cost flat in the graph size: who must still acknowledge a pending checkpoint
in a narrow table (``finalckpt_acks_due``) instead of the plan's JSON ``to_ack`` list, and the
acknowledgements indexed by stage; what a checkpoint records of a finished stage in a narrow
column (``finalckpt_stages.final_end``) instead of JSON paths into its final snapshot.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

Data: for every PENDING checkpoint, each stage of its plan's ``to_ack`` that has not
acknowledged it yet gets its row, so a pipeline running across the upgrade keeps running (its
stages acknowledge through the new table; the count ``acks_pending`` is unchanged). Every
finished stage gets its ``final_end`` from its final snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the table and the indexes, then fill the table for the pending checkpoints."""
    op.create_table(
        "finalckpt_acks_due",
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("stage_id", sa.String(length=250), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_key", "checkpoint_id"],
            ["finalckpt_checkpoints.pipeline_key", "finalckpt_checkpoints.checkpoint_id"],
            name=op.f("fk_finalckpt_acks_due_pipeline_key_finalckpt_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_key", "checkpoint_id", "stage_id", name=op.f("pk_finalckpt_acks_due")
        ),
    )
    op.create_index(
        "ix_finalckpt_acks_due_stage",
        "finalckpt_acks_due",
        ["pipeline_key", "stage_id", "checkpoint_id"],
    )
    op.create_index(
        "ix_finalckpt_acks_stage", "finalckpt_acks", ["pipeline_key", "stage_id", "checkpoint_id"]
    )
    conn = op.get_bind()
    rows = _due_rows(
        conn.execute(
            sa.text(
                "SELECT pipeline_key, checkpoint_id, plan FROM finalckpt_checkpoints "
                "WHERE state = 'PENDING'"
            )
        ).all(),
        conn.execute(
            sa.text(
                "SELECT a.pipeline_key, a.checkpoint_id, a.stage_id FROM finalckpt_acks a "
                "JOIN finalckpt_checkpoints c ON c.pipeline_key = a.pipeline_key "
                "AND c.checkpoint_id = a.checkpoint_id WHERE c.state = 'PENDING'"
            )
        ).all(),
    )
    if rows:
        due = sa.table(
            "finalckpt_acks_due",
            sa.column("pipeline_key", sa.String()),
            sa.column("checkpoint_id", sa.BigInteger()),
            sa.column("stage_id", sa.String()),
        )
        conn.execute(due.insert(), rows)
    _add_final_end(conn)


def _add_final_end(conn: Any) -> None:
    """The ``final_end`` column, filled for every stage with a final snapshot."""
    op.add_column("finalckpt_stages", sa.Column("final_end", sa.JSON(), nullable=True))
    stages = sa.table(
        "finalckpt_stages",
        sa.column("pipeline_key", sa.String()),
        sa.column("stage_id", sa.String()),
        sa.column("final_snapshot", sa.JSON()),
        sa.column("final_end", sa.JSON()),
    )
    rows = [
        {"b_key": key, "b_stage": sid, "final_end": final_end(final)}
        for key, sid, final in conn.execute(
            sa.select(stages.c.pipeline_key, stages.c.stage_id, stages.c.final_snapshot).where(
                stages.c.final_snapshot.is_not(None)
            )
        ).all()
        if final
    ]
    if rows:
        conn.execute(
            stages.update()
            .where(
                stages.c.pipeline_key == sa.bindparam("b_key"),
                stages.c.stage_id == sa.bindparam("b_stage"),
            )
            .values(final_end=sa.bindparam("final_end")),
            rows,
        )


def final_end(final: Any) -> dict[str, Any]:
    """A final snapshot's ``final_end`` (as ``store.rows.final_end`` writes it), from its
    stored JSON: the migration does not depend on the current model.
    """
    data = json.loads(final) if isinstance(final, str) else dict(final)
    return {
        "end_of_data": data.get("end_of_data"),
        "watermark": data.get("watermark"),
        "finished": len(data.get("finished_splits") or ()),
    }


def _due_rows(pending: Iterable[Any], acked: Iterable[Any]) -> list[Mapping[str, object]]:
    """One row per stage of a pending checkpoint's ``to_ack`` that has not acknowledged it."""
    done = {(str(key), int(cid), str(sid)) for key, cid, sid in acked}
    rows: list[Mapping[str, object]] = []
    for key, cid, plan in pending:
        data = json.loads(plan) if isinstance(plan, str) else (plan or {})
        for sid in data.get("to_ack") or ():
            if (str(key), int(cid), str(sid)) not in done:
                rows.append({"pipeline_key": key, "checkpoint_id": int(cid), "stage_id": sid})
    return rows


def downgrade() -> None:
    """Drop the column, the table and the indexes (the plans still hold ``to_ack``, the final
    snapshots what ``final_end`` held).
    """
    op.drop_column("finalckpt_stages", "final_end")
    op.drop_index("ix_finalckpt_acks_stage", table_name="finalckpt_acks")
    op.drop_index("ix_finalckpt_acks_due_stage", table_name="finalckpt_acks_due")
    op.drop_table("finalckpt_acks_due")
