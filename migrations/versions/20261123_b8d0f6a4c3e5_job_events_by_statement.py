"""job events by statement: one trigger call and a few NOTIFYs per statement, not per row

A micro-batch claims and finishes many jobs in one UPDATE, and the API inserts
many jobs in one INSERT. The row trigger ran PL/pgSQL and sent a NOTIFY for
every row; statement triggers over transition tables write the same events and
webhook deliveries set-based, and notify the changed job ids in chunks.

Revision ID: b8d0f6a4c3e5
Revises: a7c9e5f3b2d4
Create Date: 2026-11-23 14:30:00

"""

from collections.abc import Sequence

from alembic import op

revision: str = "b8d0f6a4c3e5"
down_revision: str | Sequence[str] | None = "a7c9e5f3b2d4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# {changed}: the rows to record, as (id, tenant_id, status, attempts, webhook_url,
# webhook_events, status_moved). Webhooks fire on a change of status only.
# A NOTIFY payload holds at most 8000 bytes: 200 ids of 36 characters fit.
_RECORD = """
    INSERT INTO job_events (job_id, status, attempt)
    SELECT id, status, attempts FROM ({changed}) AS c;
    INSERT INTO webhook_deliveries (job_id, tenant_id, event_type, message_id, url)
    SELECT id, tenant_id, 'job.' || status,
           'msg_' || replace(gen_random_uuid()::text, '-', ''), webhook_url
    FROM ({changed}) AS c
    WHERE status_moved AND webhook_url IS NOT NULL AND ('job.' || status) = ANY (webhook_events);
    PERFORM pg_notify('job_events', ids) FROM (
        SELECT string_agg(id::text, ',') AS ids
        FROM (SELECT id, row_number() OVER () / 200 AS part FROM ({changed}) AS c) AS numbered
        GROUP BY part
    ) AS chunks;
"""

_INSERTED = """
    SELECT id, tenant_id, status, attempts, webhook_url, webhook_events, true AS status_moved
    FROM inserted
"""

_UPDATED = """
    SELECT n.id, n.tenant_id, n.status, n.attempts, n.webhook_url, n.webhook_events,
           n.status IS DISTINCT FROM o.status AS status_moved
    FROM updated AS n JOIN previous AS o ON o.id = n.id
    WHERE n.status IS DISTINCT FROM o.status OR n.attempts IS DISTINCT FROM o.attempts
"""


def _statement_trigger(kind: str, event: str, tables: str, changed: str) -> str:
    """`record_jobs_<kind>()` and its trigger, recording the rows `changed` selects."""
    return f"""
CREATE FUNCTION record_jobs_{kind}() RETURNS trigger AS $$
BEGIN
{_RECORD.format(changed=changed)}
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_record_{kind} AFTER {event} ON jobs
    REFERENCING {tables}
    FOR EACH STATEMENT EXECUTE FUNCTION record_jobs_{kind}();
"""


STATEMENT_TRIGGERS = (
    "DROP TRIGGER jobs_record_event ON jobs; DROP FUNCTION record_job_event();"
    + _statement_trigger("inserted", "INSERT", "NEW TABLE AS inserted", _INSERTED)
    + _statement_trigger(
        "updated", "UPDATE", "OLD TABLE AS previous NEW TABLE AS updated", _UPDATED
    )
)

# As the webhooks revision left it.
ROW_TRIGGER = """
DROP TRIGGER jobs_record_inserted ON jobs;
DROP TRIGGER jobs_record_updated ON jobs;
DROP FUNCTION record_jobs_inserted();
DROP FUNCTION record_jobs_updated();

CREATE FUNCTION record_job_event() RETURNS trigger AS $$
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
CREATE TRIGGER jobs_record_event AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION record_job_event();
"""


def upgrade() -> None:
    op.execute(STATEMENT_TRIGGERS)


def downgrade() -> None:
    op.execute(ROW_TRIGGER)
