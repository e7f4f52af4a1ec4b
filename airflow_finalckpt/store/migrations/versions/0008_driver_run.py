"""The DAG run driving a pipeline: ``finalckpt_pipelines.driver_dag_id`` / ``driver_run_id``,
so a second DAG run on the same pipeline key is refused (or takes it over explicitly) instead
of fencing the first one's attempts in turn (docs/protocol.md, "One DAG run drives").

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27

Data: none. NULL: no driver recorded; the next stage task records its DAG run.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable columns."""
    op.add_column("finalckpt_pipelines", sa.Column("driver_dag_id", sa.String(250), nullable=True))
    op.add_column("finalckpt_pipelines", sa.Column("driver_run_id", sa.String(250), nullable=True))


def downgrade() -> None:
    """Drop them."""
    op.drop_column("finalckpt_pipelines", "driver_run_id")
    op.drop_column("finalckpt_pipelines", "driver_dag_id")
