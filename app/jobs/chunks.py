"""Chunk jobs as their batch sees them: a batch finishes when its last chunk
does, stopping a batch stops its chunks, and a chunk's rows may be read in
place from its uploaded file.

`settle` must run after the chunks' own changes were committed: of two workers
finishing a batch's last two chunks at once, the one that commits last then
sees both, so some settle always finishes the batch, and its guarded UPDATE
finishes it once, writing its webhook deliveries in the same statement. The
sweep settles too, for chunks finished by a lease or deadline sweep.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

from app.jobs.transitions import UUIDS
from app.statuses import BATCH_OPEN_SQL, OPEN_SQL


# Where a batch's objects live in the file store, named by ids the service made:
# a client's input never becomes part of a key.
def file_key(tenant_id: int, file_id: uuid.UUID) -> str:
    return f"files/{tenant_id}/{file_id}"


def batch_key(batch_id: uuid.UUID) -> str:
    """Every object of the batch is under this key (deleted together)."""
    return f"batches/{batch_id}"


def inputs_key(batch_id: uuid.UUID, index: int) -> str:
    """A chunk's checked inputs, packed, where they were cut from a text or Parquet file."""
    return f"{batch_key(batch_id)}/inputs/{index:08d}"


def result_key(batch_id: uuid.UUID, index: int) -> str:
    """A chunk's outputs, packed: written again whole by a retried chunk."""
    return f"{batch_key(batch_id)}/results/{index:08d}"


# Files uploaded before the file store are kept in PostgreSQL in parts of exactly
# this size (the last may be shorter), and still read from there.
PART_BYTES = 1 << 20


# Each part's slice of the range. On parts stored uncompressed (STORAGE EXTERNAL),
# substring reads only the TOAST chunks it needs: a range costs about its own size.
_RANGE = text(
    """
    SELECT substring(data FROM greatest(:offset - seq * :part, 0) + 1
                     FOR least(:offset + :size - seq * :part, :part)
                         - greatest(:offset - seq * :part, 0))
    FROM file_parts WHERE file_id = :file AND seq BETWEEN :first AND :last ORDER BY seq
    """
)


def read_range(session: Session, file_id: uuid.UUID, offset: int, size: int) -> bytes:
    """`size` bytes of the file from `offset`: only those bytes are read and sent."""
    first, last = offset // PART_BYTES, (offset + size - 1) // PART_BYTES
    params = {"file": file_id, "first": first, "last": last, "offset": offset, "size": size,
              "part": PART_BYTES}  # fmt: skip
    chunk = b"".join(session.scalars(_RANGE, params))
    if len(chunk) != size:
        raise ValueError(f"file {file_id} has no bytes {offset}-{offset + size - 1}")
    return chunk


def stop_chunks(session: Session, batch_id: uuid.UUID) -> None:
    """Queued chunks end cancelled now; running ones at their finish."""
    session.execute(
        text("UPDATE jobs SET cancel_requested_at = coalesce(cancel_requested_at, now()), "
             "status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END, "
             "finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END "
             f"WHERE batch_id = :id AND status IN ({OPEN_SQL})"),
        {"id": batch_id},
    )  # fmt: skip


_SETTLE = text(
    f"""
    WITH ready AS (  -- no chunk left: a probe of ix_jobs_batch_open per batch
        SELECT b.id FROM batches b
        WHERE b.id = ANY(:ids) AND b.status IN ({BATCH_OPEN_SQL})
          AND (b.status = 'running' OR b.cancel_requested_at IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.id
                          AND j.batch_id IS NOT NULL AND j.status IN ({OPEN_SQL}))
    ),
    counts AS (
        SELECT r.id, 0 AS open,
               count(j.id) FILTER (WHERE j.status = 'succeeded') AS good,
               count(j.id) FILTER (WHERE j.status <> 'succeeded') AS bad,
               coalesce(sum(coalesce(j.output_bytes, octet_length(j.output_data))), 0)
                   AS result_bytes
        FROM ready r LEFT JOIN jobs j ON j.batch_id = r.id
        GROUP BY r.id
    ),
    done AS (
        UPDATE batches b SET
            status = CASE WHEN b.error_code IS NOT NULL THEN 'failed'
                          WHEN b.cancel_requested_at IS NOT NULL THEN 'cancelled'
                          WHEN c.bad = 0 THEN 'succeeded'
                          WHEN c.good = 0 THEN 'failed'
                          ELSE 'partially_succeeded' END,
            finished_at = now(), result_bytes = c.result_bytes
        FROM counts c WHERE b.id = c.id AND c.open = 0
        RETURNING b.id, b.tenant_id, b.status, b.webhook_url, b.webhook_events
    ),
    deliveries AS (
        INSERT INTO webhook_deliveries (batch_id, tenant_id, event_type, message_id, url)
        SELECT id, tenant_id, 'batch.' || status,
               'msg_' || replace(gen_random_uuid()::text, '-', ''), webhook_url
        FROM done WHERE webhook_url IS NOT NULL AND ('batch.' || status) = ANY (webhook_events)
    )
    SELECT id FROM done
    """
).bindparams(bindparam("ids", type_=UUIDS))


def settle(session: Session, batch_ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    """Finish the batches among these whose every chunk has finished; returns them.
    The caller commits. Must run after the chunks' own changes were committed."""
    ids = list(set(batch_ids))
    if not ids:
        return []
    return [r.id for r in session.execute(_SETTLE, {"ids": ids})]
