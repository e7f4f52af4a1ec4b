"""Which try of a stage task published the stage: ``finalckpt_stages.published_by`` holds the
(DAG id, run id, task id, try number) whose successful return reported the stage CLOSED, so a
later try of the same task in the same DAG run can tell a clear of a succeeded task (recompute)
from a retry (resume): see ``core.rerun``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27

Data: none. A stage closed before this revision has no record and is re-published by a new
try, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column."""
    op.add_column("finalckpt_stages", sa.Column("published_by", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop it (closed stages are then re-published by new tries, as before 0006)."""
    op.drop_column("finalckpt_stages", "published_by")
