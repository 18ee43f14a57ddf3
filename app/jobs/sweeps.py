"""Periodic reconciliation, run by celery beat: PostgreSQL is the truth, the
broker only a hint. Each sweep is a guarded UPDATE on one slice of the jobs
table, safe to run concurrently or twice.

- leases: jobs whose worker died go back to the queue (or fail at their cap);
- waiting: models with jobs back from a retry's backoff, jobs whose wake-up
  failed to publish, or jobs queued too long (a wake-up lost with the broker)
  get a wake-up; wake-ups are per model, so a backlog costs one message;
- deadlines: jobs past their deadline expire;
- retention: old inputs and outputs are deleted, idempotency keys after 24 h, and
  the logs jobs leave (events, webhook payloads and logs, dead letters, audit
  rows) each after its own setting (app.jobs.retention).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.jobs import idempotency, retention, transitions
from app.jobs.chunks import batch_key
from app.jobs.dispatch import Dispatcher
from app.jobs.guards import ALL_ON, Guards
from app.platform.filestore import FileStore
from app.platform.settings import Settings

logger = logging.getLogger(__name__)

BATCH = 500


def sweep(
    session: Session, settings: Settings, dispatcher: Dispatcher, guards: Guards = ALL_ON
) -> dict[str, int]:
    """Each step commits on its own: one that fails leaves the others done. The
    lease and republish steps run while their guards are on (always, but in the
    fault suite)."""
    counts: dict[str, int] = {}
    if guards.lease:
        counts["requeued_after_lost_worker"] = len(
            transitions.take_back_expired_leases(
                session, settings.retry_backoff_seconds, settings.retry_backoff_max_seconds, BATCH
            )
        )
        session.commit()
    counts["expired"] = transitions.expire_overdue(session, BATCH)
    session.commit()
    if guards.republish:
        counts["woken_for"] = wake_waiting(session, dispatcher, settings.republish_after_seconds)
    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts


def wake_waiting(session: Session, dispatcher: Dispatcher, older_than_s: float) -> int:
    """Wake every model whose due jobs no wake-up may be on its way for; returns
    how many jobs that concerned."""
    waiting = transitions.models_waiting(session, older_than_s)
    session.commit()  # marked sent before the wake-ups go out
    for model in waiting:
        dispatcher.wake(model, force=True)
    return sum(waiting.values())


def purge(session: Session, settings: Settings, store: FileStore) -> dict[str, Any]:
    keys = idempotency.forget_expired(session)
    session.commit()
    total = objects = 0
    if settings.retention_seconds > 0:
        while count := transitions.purge_old_data(session, settings.retention_seconds, BATCH):
            session.commit()
            total += count
        session.commit()
        objects = purge_batch_objects(session, store, settings.retention_seconds)
    secrets = forget_previous_secrets(session)
    session.commit()
    return {"purged": total, "batch_objects": objects, "idempotency_keys": keys,
            "previous_webhook_secrets": secrets,
            **retention.prune_all(session, settings)}  # fmt: skip


def purge_batch_objects(session: Session, store: FileStore, older_than_s: float) -> int:
    """Delete the file store's objects (chunk inputs, results) of batches finished
    longer ago than retention, as their chunks' data in PostgreSQL is; returns how
    many batches. Each is marked once its objects are gone, so a failed delete is
    tried again at the next purge."""
    done = 0
    while True:
        ids = list(session.scalars(_OLD_BATCHES, {"age": older_than_s, "limit": BATCH}))
        session.commit()
        for batch_id in ids:
            store.delete(batch_key(batch_id))
            session.execute(_PURGED, {"id": batch_id})
            session.commit()
        done += len(ids)
        if len(ids) < BATCH:
            return done


_OLD_BATCHES = text(
    "SELECT id FROM batches WHERE purged_at IS NULL AND finished_at IS NOT NULL "
    "AND finished_at < now() - make_interval(secs => :age) ORDER BY finished_at LIMIT :limit"
)
_PURGED = text("UPDATE batches SET purged_at = now() WHERE id = :id")


def forget_previous_secrets(session: Session) -> int:
    """A rotated-out webhook secret signs nothing after its overlap: it is erased
    then, so a later leak of the database does not carry it."""
    statement = text(
        "UPDATE tenants SET previous_webhook_secret = NULL, previous_secret_expires_at = NULL "
        "WHERE previous_secret_expires_at < now() RETURNING id"
    )
    return len(session.execute(statement).all())
