"""Retention of finished batches: their objects in the file store (chunk inputs,
results), deleted as their chunks' data in PostgreSQL is (a batch is marked once
its objects are gone, so a failed delete is tried again at the next purge); and,
JOB_RETENTION_SECONDS after a batch finished, its rows: its chunk jobs a piece at
a time, then the batch with what hangs on it. Nothing here commits."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.jobs.chunks import batch_key
from app.platform.filestore import FileStore

_OLD_BATCHES = text(
    "SELECT id FROM batches WHERE purged_at IS NULL AND finished_at IS NOT NULL "
    "AND finished_at < now() - make_interval(secs => :age) ORDER BY finished_at LIMIT :limit"
)
_PURGED = text("UPDATE batches SET purged_at = now() WHERE id = :id")
# Oldest first (ix_batches_finished), but those a dead letter still names.
_EXPIRED = text(
    "SELECT id FROM batches b WHERE finished_at < now() - make_interval(secs => :age) "
    "AND NOT EXISTS (SELECT 1 FROM dead_letters l WHERE l.batch_id = b.id) "
    "ORDER BY finished_at LIMIT :limit"
)
_CHUNKS = text(
    "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE batch_id = :id LIMIT :limit) "
    "RETURNING id"
)
_BATCH = text("DELETE FROM batches WHERE id = :id")


def old_batches(session: Session, older_than_s: float, limit: int) -> list[uuid.UUID]:
    """Batches finished longer ago than `older_than_s` whose objects are still kept."""
    return list(session.scalars(_OLD_BATCHES, {"age": older_than_s, "limit": limit}))


def purge_objects(session: Session, store: FileStore, batch_id: uuid.UUID) -> None:
    """Delete the batch's objects from the store, and mark it purged."""
    store.delete(batch_key(batch_id))
    session.execute(_PURGED, {"id": batch_id})


def expired(session: Session, older_than_s: float, limit: int) -> list[uuid.UUID]:
    """Batches finished longer ago than `older_than_s`, whose rows are to go."""
    return list(session.scalars(_EXPIRED, {"age": older_than_s, "limit": limit}))


def delete_chunks(session: Session, batch_id: uuid.UUID, limit: int) -> int:
    """Up to `limit` of the batch's chunk jobs, deleted; how many."""
    return len(session.execute(_CHUNKS, {"id": batch_id, "limit": limit}).all())


def delete_batch(session: Session, store: FileStore, batch_id: uuid.UUID) -> None:
    """The batch's objects and its row, with what is left that hangs on it."""
    store.delete(batch_key(batch_id))
    session.execute(_BATCH, {"id": batch_id})
