"""The deployment's own secrets (issue 37): ``finalckpt_deployment_secrets`` holds the random
code signing key generated once when ``[finalckpt] code_signing_key`` is unset (before, the
key was derived from the store URL and could be guessed).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

Data: none (the key is generated on first use, by the first task that seals code).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create finalckpt_deployment_secrets."""
    op.create_table(
        "finalckpt_deployment_secrets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_finalckpt_deployment_secrets")),
    )


def downgrade() -> None:
    """Undo ``upgrade``."""
    op.drop_table("finalckpt_deployment_secrets")
