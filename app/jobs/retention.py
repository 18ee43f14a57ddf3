"""Retention of what grows with every job: the jobs' rows themselves, and the
logs they leave (job events, webhook payloads, delivery logs, dead letters and
audit rows), each kept for its own setting.

The purge sweep deletes in batches of BATCH rows, one unit of work each, walking
the table's primary key upwards (ids grow with time, so old rows come first and
each batch is one index range), and at most MAX_BATCHES a table per run, so an
hourly purge never holds a lock or a worker for long; the next run goes on.

A finished job's row goes JOB_RETENTION_SECONDS after it finished, and with it
everything that hangs on it (events, deliveries and their attempts, its
idempotency key, stream entries: ON DELETE CASCADE, each found by an index on
its job id). Batched deletes in `finished_at` order, not time partitions: the
jobs' id is a UUID that six tables reference, and a partitioned table's unique
keys must hold its partition column, so partitions would change every key and
reference; a batch of deletes is one range of a partial index, and autovacuum
hands the space to the next inserts, so the tables stay flat (they do not shrink).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.platform.settings import Settings
from app.statuses import TERMINAL

BATCH = 500
MAX_BATCHES = 2000

# Finished deliveries only; a failed one is kept while its dead letter is.
_DELIVERY_DONE = (
    "(status IN ('delivered', 'disabled') OR (status = 'failed' AND NOT EXISTS "
    "(SELECT 1 FROM dead_letters l WHERE l.delivery_id = webhook_deliveries.id)))"
)


@dataclass(frozen=True)
class Rule:
    name: str
    table: str
    at: str  # the column that ages
    where: str = "true"
    action: str = "DELETE"  # or "SET ..." to clear columns instead


def rules(settings: Settings) -> list[tuple[Rule, float]]:
    """Each kind of row with its retention in seconds (0: kept forever)."""
    return [
        (Rule("job_events", "job_events", "at"), settings.job_event_retention_seconds),
        (
            Rule(
                "webhook_payloads",
                "webhook_deliveries",
                "created_at",
                "payload IS NOT NULL AND status IN ('delivered', 'failed', 'disabled')",
                "SET payload = NULL",
            ),
            settings.webhook_payload_retention_seconds,
        ),
        (
            Rule("webhook_attempts", "webhook_attempts", "at"),
            settings.webhook_log_retention_seconds,
        ),
        (
            Rule("webhook_deliveries", "webhook_deliveries", "created_at", _DELIVERY_DONE),
            settings.webhook_log_retention_seconds,
        ),
        (
            Rule("dead_letters", "dead_letters", "created_at"),
            settings.dead_letter_retention_seconds,
        ),
        (Rule("audit_events", "audit_events", "at"), settings.audit_retention_seconds),
    ]


# Finished jobs outside batches (a batch's chunks go with it: app.batches.retention),
# oldest first (ix_jobs_finished), but those a dead letter still names.
_OLDEST_FINISHED = """
    SELECT id FROM jobs j
    WHERE finished_at < now() - make_interval(secs => :age) AND batch_id IS NULL
      AND status = ANY(:terminal)
      AND NOT EXISTS (SELECT 1 FROM dead_letters l WHERE l.job_id = j.id)
    ORDER BY finished_at LIMIT :limit
"""
_OLD_JOBS = text(
    f"DELETE FROM jobs WHERE id IN ({_OLDEST_FINISHED} FOR UPDATE SKIP LOCKED) RETURNING id"
)


def delete_old_jobs(session: Session, older_than_s: float) -> int:
    """Up to BATCH jobs finished longer ago than `older_than_s`, deleted with what
    hangs on them; how many."""
    params = {"age": older_than_s, "terminal": sorted(TERMINAL), "limit": BATCH}
    return len(session.execute(_OLD_JOBS, params).all())


def prune_piece(session: Session, rule: Rule, older_than_s: float, after: int) -> list[int]:
    """Up to BATCH rows of `rule` older than `older_than_s`, with ids above `after`,
    deleted (or cleared); their ids."""
    chosen = (
        f"SELECT id FROM {rule.table} WHERE id > :after AND {rule.at} < "
        f"now() - make_interval(secs => :age) AND {rule.where} ORDER BY id LIMIT :limit"
    )
    if rule.action == "DELETE":
        statement = f"DELETE FROM {rule.table} WHERE id IN ({chosen}) RETURNING id"
    else:
        statement = f"UPDATE {rule.table} {rule.action} WHERE id IN ({chosen}) RETURNING id"
    params = {"after": after, "age": older_than_s, "limit": BATCH}
    return [row.id for row in session.execute(text(statement), params)]
