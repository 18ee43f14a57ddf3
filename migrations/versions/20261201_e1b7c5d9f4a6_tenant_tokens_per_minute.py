"""tenants.max_tokens_per_minute: a tenant's budget of generated and prompt tokens

The tokens its generations take a minute (prompt plus completion), counted by
the decoding workers in Redis; beyond it a generation's submit gets 429 with
Retry-After. NULL: the TENANT_MAX_TOKENS_PER_MINUTE setting applies.

Revision ID: e1b7c5d9f4a6
Revises: d0a6b4c8e3f5
Create Date: 2026-12-01 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e1b7c5d9f4a6"
down_revision: str | Sequence[str] | None = "d0a6b4c8e3f5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("max_tokens_per_minute", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("tenants", "max_tokens_per_minute")
