"""Periodic reconciliation, run by celery beat: PostgreSQL is the truth, the
broker only a hint. Each step is a guarded UPDATE on one slice of the jobs
table, safe to run concurrently or twice; the maintenance operations run each
as a unit of work of its own, so one that fails leaves the others done.

- leases: jobs whose worker died go back to the queue (or fail at their cap);
- waiting: models with jobs back from a retry's backoff, jobs whose wake-up
  failed to publish, or jobs queued too long (a wake-up lost with the broker)
  get a wake-up; wake-ups are per model, so a backlog costs one message;
- deadlines: jobs past their deadline expire;
- retention: old inputs and outputs are deleted a piece at a time, idempotency
  keys after 24 h (the logs jobs leave, each after its own setting, are
  app.jobs.retention's).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.jobs import transitions

BATCH = 500


def take_back(session: Session, backoff_s: float, backoff_max_s: float) -> int:
    """Jobs whose worker died, queued again after a backoff (or failed at their cap);
    how many were queued again."""
    return len(transitions.take_back_expired_leases(session, backoff_s, backoff_max_s, BATCH))


def expire(session: Session) -> int:
    """Jobs past their deadline, ended `expired`."""
    return transitions.expire_overdue(session, BATCH)


def purge_piece(session: Session, older_than_s: float) -> int:
    """Inputs and outputs of up to BATCH jobs finished longer ago than
    `older_than_s`, deleted (their metadata stays)."""
    return transitions.purge_old_data(session, older_than_s, BATCH)
