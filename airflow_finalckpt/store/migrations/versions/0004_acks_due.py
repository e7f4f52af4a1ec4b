"""Acknowledgement cost flat in the graph size: who must still acknowledge a pending checkpoint
in a narrow table (``finalckpt_acks_due``) instead of the plan's JSON ``to_ack`` list, and the
acknowledgements indexed by stage.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

Data: for every PENDING checkpoint, each stage of its plan's ``to_ack`` that has not
acknowledged it yet gets its row, so a pipeline running across the upgrade keeps running (its
stages acknowledge through the new table; the count ``acks_pending`` is unchanged).
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
    """Drop the table and the indexes (the plans still hold ``to_ack``)."""
    op.drop_index("ix_finalckpt_acks_stage", table_name="finalckpt_acks")
    op.drop_index("ix_finalckpt_acks_due_stage", table_name="finalckpt_acks_due")
    op.drop_table("finalckpt_acks_due")
