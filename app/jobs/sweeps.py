"""Periodic reconciliation, run by celery beat: PostgreSQL is the truth, the
broker only a hint. Each sweep is a guarded UPDATE on one slice of the jobs
table, safe to run concurrently or twice.

- leases: jobs whose worker died go back to the queue (or fail at their cap);
- due: jobs waiting out a retry backoff, or whose publish failed, are sent;
- lost: jobs whose message vanished (broker flushed) are sent again, checked
  only once the queue has drained, so a backlog is never republished;
- deadlines: jobs past their deadline expire;
- retention: old inputs and outputs are deleted, and idempotency keys after 24 h.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from app.config import Settings
from app.jobs import dispatch, idempotency, transitions

logger = logging.getLogger(__name__)

BATCH = 500


def sweep(session: Session, settings: Settings) -> dict[str, int]:
    counts: dict[str, int] = {}
    if "lease" not in settings.guards_off:
        counts["requeued_after_lost_worker"] = len(
            transitions.take_back_expired_leases(
                session, settings.retry_backoff_seconds, settings.retry_backoff_max_seconds, BATCH
            )
        )
    counts["expired"] = transitions.expire_overdue(session, BATCH)
    if "republish" not in settings.guards_off:
        counts["published_due"] = publish_due(session)
        counts["republished_lost"] = republish_lost(session, settings.republish_after_seconds)
    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts


def publish_due(session: Session) -> int:
    ids = transitions.take_due(session, BATCH)
    if ids and not dispatch.enqueue(ids):
        transitions.mark_unsent(session, ids)
        return 0
    return len(ids)


def republish_lost(session: Session, older_than_s: float) -> int:
    """A job that waits behind a backlog is not lost; with the queue drained, a job
    still queued after `older_than_s` has no message left. A job a worker reserved
    but has not claimed yet may get a second message; the claim guard makes it a no-op."""
    if dispatch.queue_depth() > 0:
        return 0
    ids = transitions.take_stale_queued(session, older_than_s, BATCH)
    if ids:
        logger.info("republishing %d queued job(s) whose message was lost", len(ids))
        dispatch.enqueue(ids)
    return len(ids)


def purge(session: Session, settings: Settings) -> dict[str, Any]:
    keys = idempotency.forget_expired(session)
    if settings.retention_seconds <= 0:
        return {"purged": 0, "idempotency_keys": keys}
    total = 0
    while count := transitions.purge_old_data(session, settings.retention_seconds, BATCH):
        total += count
    return {"purged": total, "idempotency_keys": keys}
