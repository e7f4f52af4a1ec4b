"""Which pipeline committed which logical date into which sink (``finalckpt_sink_dates``): a
sink without a declared slice appends, so the task log warns when a second pipeline commits the
same logical date into it (``store.sink_dates``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27

Data: none (commits before this revision are not recorded; the warning starts with them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create finalckpt_sink_dates."""
    op.create_table(
        "finalckpt_sink_dates",
        sa.Column("sink", sa.String(length=250), nullable=False),
        sa.Column("logical_date", sa.String(length=64), nullable=False),
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("stage_id", sa.String(length=250), nullable=False),
        sa.Column("committed_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_key"],
            ["finalckpt_pipelines.pipeline_key"],
            name=op.f("fk_finalckpt_sink_dates_pipeline_key_finalckpt_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "sink", "logical_date", "pipeline_key", name=op.f("pk_finalckpt_sink_dates")
        ),
    )


def downgrade() -> None:
    """Undo ``upgrade``."""
    op.drop_table("finalckpt_sink_dates")
