"""jobs.reply_to: a sync call's reply channel

A sync call's job names the Redis channel of the process whose caller waits
(app.jobs.replies); the worker publishes the answer there once the job's record
is committed. NULL for every other job, and for jobs written before.

Revision ID: a7d3e9f1c2b4
Revises: f1a2b3c4d5e6
Create Date: 2026-11-27 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7d3e9f1c2b4"
down_revision: str | Sequence[str] | None = "f1a2b3c4d5e6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("reply_to", sa.Text))


def downgrade() -> None:
    op.drop_column("jobs", "reply_to")
