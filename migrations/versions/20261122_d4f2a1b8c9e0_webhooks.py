"""webhooks: per-job subscriptions, deliveries made by the job_events trigger,
attempt log, disabled URLs, secret rotation, dead letters for deliveries

Revision ID: d4f2a1b8c9e0
Revises: c3e1f0a9d2b7
Create Date: 2026-11-22 21:50:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d4f2a1b8c9e0"
down_revision: str | Sequence[str] | None = "c3e1f0a9d2b7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A subscribed change of status also queues a webhook delivery, in the same statement.
RECORD_JOB_EVENT = """
CREATE OR REPLACE FUNCTION record_job_event() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO job_events (job_id, status, attempt) VALUES (NEW.id, NEW.status, NEW.attempts);
        IF NEW.webhook_url IS NOT NULL
           AND (TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status)
           AND ('job.' || NEW.status) = ANY (NEW.webhook_events) THEN
            INSERT INTO webhook_deliveries (job_id, tenant_id, event_type, message_id, url)
            VALUES (NEW.id, NEW.tenant_id, 'job.' || NEW.status,
                    'msg_' || replace(gen_random_uuid()::text, '-', ''), NEW.webhook_url);
        END IF;
        PERFORM pg_notify('job_events', NEW.id::text);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
"""

# A job's dead letter is an event too (job.dead_lettered).
RECORD_DEAD_LETTER = """
CREATE FUNCTION record_dead_letter_event() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhook_deliveries (job_id, tenant_id, event_type, message_id, url)
    SELECT j.id, j.tenant_id, 'job.dead_lettered',
           'msg_' || replace(gen_random_uuid()::text, '-', ''), j.webhook_url
    FROM jobs j
    WHERE j.id = NEW.job_id AND NEW.delivery_id IS NULL AND j.webhook_url IS NOT NULL
      AND 'job.dead_lettered' = ANY (j.webhook_events);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER dead_letters_record_event AFTER INSERT ON dead_letters
    FOR EACH ROW EXECUTE FUNCTION record_dead_letter_event();
"""


def upgrade() -> None:
    op.add_column("jobs", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.add_column(
        "jobs", sa.Column("webhook_events", postgresql.ARRAY(sa.String(length=32)), nullable=True)
    )
    op.add_column(
        "tenants", sa.Column("previous_webhook_secret", sa.String(length=100), nullable=True)
    )
    op.add_column(
        "tenants",
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("event_type", sa.String(length=32), nullable=False),
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True),
                  server_default=sa.text("now()"), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("message_id"),
    )
    op.create_index("ix_webhook_deliveries_job", "webhook_deliveries", ["job_id", "id"])
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["next_attempt_at"],
        postgresql_where=sa.text("status IN ('pending', 'sending')"),
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("delivery_id", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])
    op.create_table(
        "disabled_webhook_urls",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "url"),
    )
    op.add_column("dead_letters", sa.Column("delivery_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        "dead_letters_delivery_id_fkey", "dead_letters", "webhook_deliveries",
        ["delivery_id"], ["id"], ondelete="CASCADE",
    )
    op.execute(RECORD_JOB_EVENT)
    op.execute(RECORD_DEAD_LETTER)


PREVIOUS_RECORD_JOB_EVENT = """
CREATE OR REPLACE FUNCTION record_job_event() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO job_events (job_id, status, attempt) VALUES (NEW.id, NEW.status, NEW.attempts);
        PERFORM pg_notify('job_events', NEW.id::text);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
"""


def downgrade() -> None:
    op.execute(PREVIOUS_RECORD_JOB_EVENT)
    op.execute("DROP TRIGGER dead_letters_record_event ON dead_letters")
    op.execute("DROP FUNCTION record_dead_letter_event()")
    op.drop_constraint("dead_letters_delivery_id_fkey", "dead_letters", type_="foreignkey")
    op.drop_column("dead_letters", "delivery_id")
    op.drop_table("disabled_webhook_urls")
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_column("tenants", "previous_secret_expires_at")
    op.drop_column("tenants", "previous_webhook_secret")
    op.drop_column("jobs", "webhook_events")
    op.drop_column("jobs", "webhook_url")
