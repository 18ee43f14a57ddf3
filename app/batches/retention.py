"""Retention of finished batches' objects in the file store (chunk inputs, results),
deleted as their chunks' data in PostgreSQL is. A batch is marked once its
objects are gone, so a failed delete is tried again at the next purge. Nothing
here commits."""

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


def old_batches(session: Session, older_than_s: float, limit: int) -> list[uuid.UUID]:
    """Batches finished longer ago than `older_than_s` whose objects are still kept."""
    return list(session.scalars(_OLD_BATCHES, {"age": older_than_s, "limit": limit}))


def purge_objects(session: Session, store: FileStore, batch_id: uuid.UUID) -> None:
    """Delete the batch's objects from the store, and mark it purged."""
    store.delete(batch_key(batch_id))
    session.execute(_PURGED, {"id": batch_id})
