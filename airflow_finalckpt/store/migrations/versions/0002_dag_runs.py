"""Map Airflow DAG runs to pipeline runs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create finalckpt_dag_runs."""
    op.create_table(
        "finalckpt_dag_runs",
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("pipeline_key", sa.String(length=250), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pipeline_key"],
            ["finalckpt_pipelines.pipeline_key"],
            name=op.f("fk_finalckpt_dag_runs_pipeline_key_finalckpt_pipelines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dag_id", "run_id", name=op.f("pk_finalckpt_dag_runs")),
    )
    op.create_index(
        op.f("ix_finalckpt_dag_runs_pipeline_key"),
        "finalckpt_dag_runs",
        ["pipeline_key"],
        unique=False,
    )


def downgrade() -> None:
    """Undo ``upgrade``."""
    op.drop_index(op.f("ix_finalckpt_dag_runs_pipeline_key"), table_name="finalckpt_dag_runs")
    op.drop_table("finalckpt_dag_runs")
