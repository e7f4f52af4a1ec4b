"""Checkpoint failure reason: the cause of an abort as an enum value next to its detail text.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

#: (cause, LIKE pattern of the detail text aborts carried before this revision), first match wins.
_BACKFILL = (
    ("expired", "timed out after %"),
    ("declined", "declined by stage %"),
    ("subsumed", "subsumed by checkpoint %"),
    ("write_failed", "writing checkpoint metadata failed%"),
    ("restored", "pipeline restored from %"),
)


def upgrade() -> None:
    """Add failure_kind and backfill it from the detail texts."""
    op.add_column("finalckpt_checkpoints", sa.Column("failure_kind", sa.String(length=20)))
    checkpoints = sa.table(
        "finalckpt_checkpoints",
        sa.column("state", sa.String()),
        sa.column("failure_reason", sa.Text()),
        sa.column("failure_kind", sa.String()),
    )
    aborted = (checkpoints.c.state == "ABORTED") & checkpoints.c.failure_kind.is_(None)
    for kind, pattern in _BACKFILL:
        op.execute(
            checkpoints.update()
            .where(aborted, checkpoints.c.failure_reason.like(pattern))
            .values(failure_kind=kind)
        )
    # Whatever else was aborted was aborted on request (Coordinator.abort).
    op.execute(checkpoints.update().where(aborted).values(failure_kind="manual"))


def downgrade() -> None:
    """Undo ``upgrade``."""
    # SQLite >= 3.35 drops a column in place (a batch copy would cascade-delete the acks).
    op.drop_column("finalckpt_checkpoints", "failure_kind")
