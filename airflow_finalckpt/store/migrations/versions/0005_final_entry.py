"""A finished stage's entry in metadata format v2, encoded once when it finishes: the column
``finalckpt_stages.final_entry`` holds the canonical JSON of its ``fully_finished`` entry
without transactions, so a completion assembles the packed block of thousands of finished
stages from these strings instead of decoding, validating and re-encoding each of them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25

Data: none. A stage finished before this revision keeps NULL and is encoded at every
completion from its ``final_end`` as before (the column is an optimization, never the only
source of what a checkpoint records).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column."""
    op.add_column("finalckpt_stages", sa.Column("final_entry", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop it (``final_end`` and the final snapshot still hold everything it encoded)."""
    op.drop_column("finalckpt_stages", "final_entry")
