"""stream bindings: a tenant's model bound to an input log and an output log

`stream_bindings` holds each binding with the full names of its logs;
`stream_entries` one row per input entry that became a job, unique per binding
and entry id (a redelivered entry finds its job here), and the outbox of its
result (`published_at`), with partial indexes on the unpublished rows for the
publisher and a BRIN index on age for retention.

Revision ID: e7c1a3f5b9d2
Revises: b2c4d6e8f0a1
Create Date: 2026-11-25 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e7c1a3f5b9d2"
down_revision: str | Sequence[str] | None = "b2c4d6e8f0a1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UUID = postgresql.UUID(as_uuid=True)
_NOW = sa.text("now()")
_UNPUBLISHED = sa.text("published_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "stream_bindings",
        sa.Column("id", _UUID, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  nullable=False),  # fmt: skip
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("model_version", sa.String(50)),
        sa.Column("input", sa.String(300), nullable=False),
        sa.Column("output", sa.String(300), nullable=False),
        sa.Column("dead_letter", sa.String(300), nullable=False),
        sa.Column("paused", sa.Boolean, server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.UniqueConstraint("input", name="uq_stream_bindings_input"),
    )
    op.create_table(
        "stream_entries",
        sa.Column("binding_id", _UUID,
                  sa.ForeignKey("stream_bindings.id", ondelete="CASCADE"), primary_key=True),  # fmt: skip
        sa.Column("entry_id", sa.String(64), primary_key=True),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("job_id", _UUID,
                  sa.ForeignKey("jobs.id", ondelete="CASCADE", deferrable=True,
                                initially="DEFERRED"), nullable=False),  # fmt: skip
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_stream_entries_unpublished", "stream_entries", ["binding_id", "created_at"],
                    postgresql_where=_UNPUBLISHED)  # fmt: skip
    op.create_index("ix_stream_entries_job", "stream_entries", ["job_id"],
                    postgresql_where=_UNPUBLISHED)  # fmt: skip
    op.create_index("ix_stream_entries_created", "stream_entries", ["created_at"],
                    postgresql_using="brin")  # fmt: skip


def downgrade() -> None:
    op.drop_table("stream_entries")
    op.drop_table("stream_bindings")
