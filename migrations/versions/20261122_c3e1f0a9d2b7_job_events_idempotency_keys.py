"""job events (trigger-fed, with NOTIFY) and idempotency keys

Revision ID: c3e1f0a9d2b7
Revises: 122a4471a444
Create Date: 2026-11-22 21:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3e1f0a9d2b7"
down_revision: str | Sequence[str] | None = "122a4471a444"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every insert of a job, and every change of its status or attempt, becomes an event
# in the same statement, and wakes the API processes that wait on the job.
RECORD_JOB_EVENT = """
CREATE FUNCTION record_job_event() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO job_events (job_id, status, attempt) VALUES (NEW.id, NEW.status, NEW.attempts);
        PERFORM pg_notify('job_events', NEW.id::text);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_record_event AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION record_job_event();
"""


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_events_job", "job_events", ["job_id", "id"], unique=False)
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "key"),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])
    op.execute(RECORD_JOB_EVENT)


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_record_event ON jobs")
    op.execute("DROP FUNCTION record_job_event()")
    op.drop_table("idempotency_keys")
    op.drop_table("job_events")
