"""jobs.traceparent: the W3C trace context a job's spans join

The door takes a `traceparent` from the request; admission's span under it is
kept with the job, so the worker's spans and the webhook deliveries join the same
trace, and the job's record shows its trace id. A nullable column: adding it
rewrites nothing.

Revision ID: f8c4d2e6a0b3
Revises: e7b3c1d5f9a2
Create Date: 2026-12-07 11:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f8c4d2e6a0b3"
down_revision: str | Sequence[str] | None = "e7b3c1d5f9a2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "traceparent")
