"""job_events.text and job_events.tokens: a generation's output, recorded in pieces

A generation's text is recorded as it is made, a row a piece (a few tokens or
a tenth of a second each, never a row a token), as `job_events` rows with status
`output`: they take their ids from the same sequence as the job's state
events, so an event stream resumed with Last-Event-ID sends every piece after
that id once, running or long finished, and a retry can read the tokens made so
far. The decoding worker inserts them itself (the job triggers record state
changes only) and notifies the channel `job_outputs`.

Revision ID: d0a6b4c8e3f5
Revises: c9f5a3b7d2e4
Create Date: 2026-11-30 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d0a6b4c8e3f5"
down_revision: str | Sequence[str] | None = "c9f5a3b7d2e4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_events", sa.Column("text", sa.Text(), nullable=True))
    op.add_column("job_events", sa.Column("tokens", postgresql.ARRAY(sa.Integer()), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM job_events WHERE status = 'output'")
    op.drop_column("job_events", "tokens")
    op.drop_column("job_events", "text")
