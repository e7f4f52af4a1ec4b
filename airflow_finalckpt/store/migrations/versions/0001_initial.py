"""Initial coordination store schema.

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Write the operations out explicitly (never ``metadata.create_all``): a revision is a frozen
snapshot, it must keep meaning the same thing when ``store/schema.py`` changes later.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create every table of the first schema."""
    op.create_table(
        "finalckpt_pipelines",
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("next_checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("retain_checkpoints", sa.Integer(), nullable=False),
        sa.Column("checkpoint_timeout_s", sa.Float(), nullable=False),
        sa.Column("restored_from", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("pipeline_key", name=op.f("pk_finalckpt_pipelines")),
    )
    op.create_table(
        "finalckpt_checkpoints",
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=20), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("acks_pending", sa.Integer(), nullable=False),
        sa.Column("triggered_at", sa.Float(), nullable=False),
        sa.Column("completed_at", sa.Float(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("metadata_path", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["pipeline_key"],
            ["finalckpt_pipelines.pipeline_key"],
            name=op.f("fk_finalckpt_checkpoints_pipeline_key_finalckpt_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_key", "checkpoint_id", name=op.f("pk_finalckpt_checkpoints")
        ),
    )
    op.create_index(
        op.f("ix_finalckpt_checkpoints_state"), "finalckpt_checkpoints", ["state"], unique=False
    )
    op.create_table(
        "finalckpt_stages",
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("stage_id", sa.String(length=250), nullable=False),
        sa.Column("lifecycle", sa.String(length=20), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("total_splits", sa.Integer(), nullable=True),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("finish_threshold", sa.BigInteger(), nullable=True),
        sa.Column("final_snapshot", sa.JSON(), nullable=True),
        sa.Column("closed_checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_key"],
            ["finalckpt_pipelines.pipeline_key"],
            name=op.f("fk_finalckpt_stages_pipeline_key_finalckpt_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_key", "stage_id", name=op.f("pk_finalckpt_stages")),
    )
    op.create_table(
        "finalckpt_stop_requests",
        sa.Column("request_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("savepoint_id", sa.BigInteger(), nullable=True),
        sa.Column("requested_by", sa.String(length=250), nullable=True),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["pipeline_key"],
            ["finalckpt_pipelines.pipeline_key"],
            name=op.f("fk_finalckpt_stop_requests_pipeline_key_finalckpt_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_finalckpt_stop_requests")),
    )
    op.create_index(
        op.f("ix_finalckpt_stop_requests_pipeline_key"),
        "finalckpt_stop_requests",
        ["pipeline_key"],
        unique=False,
    )
    op.create_table(
        "finalckpt_transactions",
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("stage_id", sa.String(length=250), nullable=False),
        sa.Column("sink_id", sa.String(length=250), nullable=False),
        sa.Column("txn_id", sa.String(length=250), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_key"],
            ["finalckpt_pipelines.pipeline_key"],
            name=op.f("fk_finalckpt_transactions_pipeline_key_finalckpt_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_key", "stage_id", "sink_id", "txn_id", name=op.f("pk_finalckpt_transactions")
        ),
    )
    op.create_table(
        "finalckpt_acks",
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("stage_id", sa.String(length=250), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("by_finish", sa.Boolean(), nullable=False),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("acked_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_key", "checkpoint_id"],
            ["finalckpt_checkpoints.pipeline_key", "finalckpt_checkpoints.checkpoint_id"],
            name=op.f("fk_finalckpt_acks_pipeline_key_finalckpt_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_key", "checkpoint_id", "stage_id", name=op.f("pk_finalckpt_acks")
        ),
    )


def downgrade() -> None:
    """Undo ``upgrade``."""
    op.drop_table("finalckpt_acks")
    op.drop_table("finalckpt_transactions")
    op.drop_index(
        op.f("ix_finalckpt_stop_requests_pipeline_key"), table_name="finalckpt_stop_requests"
    )
    op.drop_table("finalckpt_stop_requests")
    op.drop_table("finalckpt_stages")
    op.drop_index(op.f("ix_finalckpt_checkpoints_state"), table_name="finalckpt_checkpoints")
    op.drop_table("finalckpt_checkpoints")
    op.drop_table("finalckpt_pipelines")
