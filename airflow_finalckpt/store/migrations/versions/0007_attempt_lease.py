"""The attempt lease of a running stage: ``finalckpt_stages.lease_until``, renewed by the
running attempt and set in the past when it fails, so a checkpoint no longer waits for a stage
whose attempt is gone (docs/protocol.md, "A stage that is not running").

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27

Data: none. NULL means "no lease": the attempts of an older version are treated as alive,
as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column."""
    op.add_column("finalckpt_stages", sa.Column("lease_until", sa.Float(), nullable=True))


def downgrade() -> None:
    """Drop it (checkpoints wait for every running stage again)."""
    op.drop_column("finalckpt_stages", "lease_until")
