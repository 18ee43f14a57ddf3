"""A tenant's batches as they stand: one, a page of them, their progress counted
from their chunks, and a cancel. Nothing here commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, text, tuple_
from sqlalchemy.orm import Session

from app.batches.tables import Batch
from app.errors import Conflict
from app.jobs.chunks import stop_chunks
from app.platform.orm import owned
from app.statuses import BATCH_TERMINAL, TERMINAL, TERMINAL_SQL, BatchStatus, JobStatus


def cancel(session: Session, tenant_id: int, batch_id: uuid.UUID) -> Batch:
    """Stop a batch: queued chunks (and the rest of its split) at once, running
    ones when they finish; Conflict once it has finished. Chunks already done keep
    their results; it finishes once settled (after the commit)."""
    batch = get(session, tenant_id, batch_id)
    if batch.status in BATCH_TERMINAL:
        raise Conflict(f"batch {batch_id} is already {batch.status}", batch_status=batch.status)
    session.execute(
        text("UPDATE batches SET cancel_requested_at = coalesce(cancel_requested_at, now()) "
             "WHERE id = :id"),
        {"id": batch_id},
    )  # fmt: skip
    stop_chunks(session, batch_id)
    return batch


def get(session: Session, tenant_id: int, batch_id: uuid.UUID) -> Batch:
    return owned(session, Batch, tenant_id, batch_id, "batch")


def list_batches(
    session: Session, tenant_id: int, limit: int, *, after: Batch | None = None,
    openai: bool = False,
) -> list[Batch]:  # fmt: skip
    """The tenant's newest batches (those older than `after`; with `openai`, only
    those made in OpenAI's Batch format)."""
    query = select(Batch).where(Batch.tenant_id == tenant_id)
    if after is not None:
        query = query.where(tuple_(Batch.created_at, Batch.id) < (after.created_at, after.id))
    if openai:
        query = query.where(Batch.openai.is_not(None))
    query = query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit)
    return list(session.scalars(query))


@dataclass
class Progress:
    rows_done: int
    rows_failed: int
    rows_pending: int
    chunks: dict[str, int]
    failed_rows: list[dict[str, Any]]  # {first, last, status, error} ranges, merged
    eta_seconds: float | None


MAX_RANGES = 100


def progress(session: Session, batch: Batch) -> Progress:
    """Counted from the chunks: one indexed aggregate, whatever the batch's size."""
    counts = session.execute(
        text("SELECT status, count(*) AS chunks, coalesce(sum(batch_rows), 0) AS rows "
             "FROM jobs WHERE batch_id = :id GROUP BY status"),
        {"id": batch.id},
    ).all()  # fmt: skip
    chunks = {r.status: r.chunks for r in counts}
    rows = {r.status: int(r.rows) for r in counts}
    done = rows.get(JobStatus.SUCCEEDED, 0)
    failed = sum(rows.get(s, 0) for s in TERMINAL - {JobStatus.SUCCEEDED})
    ranges: list[dict[str, Any]] = []
    if failed:
        bad = session.execute(
            text("SELECT first_row, batch_rows, status, error_code FROM jobs "
                 f"WHERE batch_id = :id AND status IN ({TERMINAL_SQL}) AND status <> 'succeeded' "
                 "ORDER BY batch_index LIMIT :limit"),
            {"id": batch.id, "limit": MAX_RANGES * 4},
        ).all()  # fmt: skip
        ranges = _merged(bad)[:MAX_RANGES]
    total = batch.rows if batch.rows is not None else None
    pending = (total - done - failed) if total is not None else sum(rows.values()) - done - failed
    return Progress(done, failed, pending, chunks, ranges, _eta(batch, done + failed, pending))


def _merged(chunks: Sequence[Any]) -> list[dict[str, Any]]:
    ranges: list[dict[str, Any]] = []
    for c in chunks:
        last = c.first_row + c.batch_rows - 1
        if (
            ranges
            and ranges[-1]["last"] + 1 == c.first_row
            and ranges[-1]["status"] == c.status
            and ranges[-1]["error"] == c.error_code
        ):
            ranges[-1]["last"] = last
        else:
            ranges.append(
                {"first": c.first_row, "last": last, "status": c.status, "error": c.error_code}
            )
    return ranges


def _eta(batch: Batch, finished: int, pending: int) -> float | None:
    if (
        batch.status != BatchStatus.RUNNING
        or batch.started_at is None
        or not finished
        or pending <= 0
    ):
        return 0.0 if batch.status in BATCH_TERMINAL else None
    elapsed = (datetime.now(UTC) - batch.started_at).total_seconds()
    return round(pending * elapsed / finished, 1)
