"""api keys may expire

Revision ID: a1b3c5d7e9f0
Revises: f4b6d8a0c2e5
Create Date: 2026-11-23 21:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a1b3c5d7e9f0"
down_revision: str | Sequence[str] | None = "f4b6d8a0c2e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "expires_at")
