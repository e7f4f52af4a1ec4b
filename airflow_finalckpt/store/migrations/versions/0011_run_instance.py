"""A DAG run deleted and created again is a new pipeline run (issue 38):
``finalckpt_dag_runs.run_instance`` (what the Task SDK told the run's tasks about their DAG run
instance: run_after, start_date, clear_number; ``core.run_instance``) and ``generation`` (the
default key's generation of that run id), ``finalckpt_pipelines.superseded_by`` (the pipeline
of the re-created run that replaced this one: retention removes a superseded pipeline).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

Data: none. NULL run_instance: not recorded yet (the run's next stage task records it and is
taken as the same run); NULL generation: 1; NULL superseded_by: not superseded.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable columns."""
    op.add_column("finalckpt_dag_runs", sa.Column("run_instance", sa.JSON(), nullable=True))
    op.add_column("finalckpt_dag_runs", sa.Column("generation", sa.Integer(), nullable=True))
    op.add_column("finalckpt_pipelines", sa.Column("superseded_by", sa.String(250), nullable=True))


def downgrade() -> None:
    """Drop them."""
    op.drop_column("finalckpt_pipelines", "superseded_by")
    op.drop_column("finalckpt_dag_runs", "generation")
    op.drop_column("finalckpt_dag_runs", "run_instance")
