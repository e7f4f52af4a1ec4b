"""Incremental sources (issue 30): ``finalckpt_source_cursors`` (the committed read position
of each source) and ``finalckpt_source_ranges`` (the range each pipeline run reads).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

Data: none (no source had a cursor before this revision).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create finalckpt_source_cursors and finalckpt_source_ranges."""
    op.create_table(
        "finalckpt_source_cursors",
        sa.Column("cursor_id", sa.String(length=250), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=True),
        sa.Column("consumed", sa.JSON(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("advanced_by", sa.String(length=250), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cursor_id", name=op.f("pk_finalckpt_source_cursors")),
    )
    op.create_table(
        "finalckpt_source_ranges",
        sa.Column("cursor_id", sa.String(length=250), nullable=False),
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("stage_id", sa.String(length=250), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("range", sa.JSON(), nullable=False),
        sa.Column("read", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("dag_id", sa.String(length=250), nullable=True),
        sa.Column("run_id", sa.String(length=250), nullable=True),
        sa.Column("logical_date", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("settled_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint(
            "cursor_id", "pipeline_key", name=op.f("pk_finalckpt_source_ranges")
        ),
    )
    op.create_index(
        "ix_finalckpt_source_ranges_pipeline",
        "finalckpt_source_ranges",
        ["pipeline_key"],
        unique=False,
    )


def downgrade() -> None:
    """Undo ``upgrade``."""
    op.drop_index("ix_finalckpt_source_ranges_pipeline", table_name="finalckpt_source_ranges")
    op.drop_table("finalckpt_source_ranges")
    op.drop_table("finalckpt_source_cursors")
