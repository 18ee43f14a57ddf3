"""job_events.logprobs: each recorded token's log-probability, when asked for

A generation asked for log-probabilities records them with its pieces, so a
retry that goes on from its earlier attempt's tokens has theirs too. A nullable
column with no default: adding it rewrites nothing.

Revision ID: d6a2b0c4e8f1
Revises: c5f1a9b3d7e0
Create Date: 2026-12-06 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d6a2b0c4e8f1"
down_revision: str | Sequence[str] | None = "c5f1a9b3d7e0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_events", sa.Column("logprobs", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("job_events", "logprobs")
