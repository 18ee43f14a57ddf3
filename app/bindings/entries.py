"""The record of each input entry that became a job, and the outbox of its result.

`record` inserts an entry's row with ON CONFLICT DO NOTHING, in the transaction
that inserts its job: an entry delivered twice (its consumer died between the
commit and the acknowledgement, or two consumers raced for it) finds the first
job (`accepted`) instead of making a second. `finished` takes the entries whose
job ended and whose result is not yet in the output log, locked (SKIP LOCKED, so
two publishers never hold the same ones); `mark_published` records that their
results were appended. Nothing here commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from app.errors import DomainError
from app.runtime.tensors import to_json, unpack
from app.statuses import TERMINAL_SQL


@dataclass(frozen=True, slots=True)
class EntryOutcome:
    """What became of one input entry: a job (`redelivered` when an earlier
    delivery made it), or the error that makes it a dead letter."""

    entry_id: str
    job_id: uuid.UUID | None = None
    redelivered: bool = False
    error: DomainError | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """An entry whose job ended, with what its output entry says."""

    output: str  # the binding's output log
    entry_id: str
    request_id: str
    job_id: uuid.UUID
    status: str
    outputs: dict[str, Any] | None
    error_code: str | None
    error_message: str | None


_ACCEPTED = text(
    "SELECT entry_id, job_id FROM stream_entries "
    "WHERE binding_id = :binding AND entry_id = ANY(:entries)"
)

_RECORD = text(
    """
    INSERT INTO stream_entries (binding_id, entry_id, request_id, job_id)
    SELECT CAST(:binding AS uuid), e.entry_id, e.request_id, e.job_id
    FROM unnest(:entries, :requests, :jobs) AS e(entry_id, request_id, job_id)
    ON CONFLICT (binding_id, entry_id) DO NOTHING
    RETURNING entry_id
    """
).bindparams(bindparam("jobs", type_=ARRAY(UUID(as_uuid=True))))

_FINISHED = """
    SELECT b.output, e.entry_id, e.request_id, e.job_id, j.status, j.output_data,
           j.outputs, j.error_code, j.error_message
    FROM stream_entries e
    JOIN jobs j ON j.id = e.job_id
    JOIN stream_bindings b ON b.id = e.binding_id
    WHERE e.published_at IS NULL AND j.status IN ({terminal}) {only}
    ORDER BY e.created_at, e.entry_id
    LIMIT :limit
    FOR UPDATE OF e SKIP LOCKED
"""
_FINISHED_ANY = text(_FINISHED.format(terminal=TERMINAL_SQL, only=""))
_FINISHED_OF = text(
    _FINISHED.format(terminal=TERMINAL_SQL, only="AND e.job_id = ANY(:jobs)")
).bindparams(bindparam("jobs", type_=ARRAY(UUID(as_uuid=True))))

_PUBLISHED = text(
    "UPDATE stream_entries SET published_at = now() "
    "WHERE job_id = ANY(:jobs) AND published_at IS NULL"
).bindparams(bindparam("jobs", type_=ARRAY(UUID(as_uuid=True))))

_PURGE = text(
    """
    DELETE FROM stream_entries WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM stream_entries
        WHERE created_at < now() - make_interval(secs => :age) AND published_at IS NOT NULL
        LIMIT :limit))
    """
)


def accepted(session: Session, binding_id: uuid.UUID, entry_ids: Sequence[str]) -> dict[str, Any]:
    """The job of each of these entries that already has one."""
    rows = session.execute(_ACCEPTED, {"binding": binding_id, "entries": list(entry_ids)})
    return {row.entry_id: row.job_id for row in rows}


def record(
    session: Session, binding_id: uuid.UUID, rows: Sequence[tuple[str, str, uuid.UUID]]
) -> set[str]:
    """Insert `(entry_id, request_id, job_id)` rows; the entries that were new (an
    entry another transaction recorded first is skipped: it waits for that one to
    end, then takes its row as the entry's)."""
    if not rows:
        return set()
    entries, requests, jobs = (list(column) for column in zip(*rows, strict=True))
    params = {"binding": binding_id, "entries": entries, "requests": requests, "jobs": jobs}
    return set(session.execute(_RECORD, params).scalars())


def finished(
    session: Session, limit: int, job_ids: Sequence[uuid.UUID] | None = None
) -> list[Finished]:
    """Up to `limit` entries whose job ended and whose result is not published,
    oldest first (of `job_ids` only, when given), locked until the transaction ends."""
    if job_ids is None:
        rows = session.execute(_FINISHED_ANY, {"limit": limit})
    else:
        rows = session.execute(_FINISHED_OF, {"limit": limit, "jobs": list(job_ids)})
    return [_finished(r) for r in rows]


def _finished(r: Any) -> Finished:
    outputs = to_json(unpack(r.output_data)) if r.output_data is not None else r.outputs
    return Finished(r.output, r.entry_id, r.request_id, r.job_id, r.status, outputs,
                    r.error_code, r.error_message)  # fmt: skip


def mark_published(session: Session, job_ids: Sequence[uuid.UUID]) -> None:
    if job_ids:
        session.execute(_PUBLISHED, {"jobs": list(job_ids)})


_UNPUBLISHED = text(
    "SELECT count(*) FROM stream_entries WHERE binding_id = :binding AND published_at IS NULL"
)


def unpublished(session: Session, binding_id: uuid.UUID) -> int:
    """The binding's entries whose result is not in its output log yet."""
    return int(session.scalar(_UNPUBLISHED, {"binding": binding_id}) or 0)


def purge(session: Session, age_s: float, limit: int = 5000) -> int:
    """Delete up to `limit` published entries older than `age_s`: their jobs keep
    the record; an entry that old is never delivered again."""
    return session.execute(_PURGE, {"age": age_s, "limit": limit}).rowcount  # type: ignore[attr-defined]
