"""Guarded state changes on the job row.

Every change is one conditional UPDATE whose WHERE clause names the state it
leaves and, for a running job, the attempt that owns it. Celery may deliver a
message twice; the second delivery then matches no row, so it can neither run
a job another worker owns nor write a second result. A job that fails is given
its dead letter in the same statement.

The `claim` and `finish` checks can be left out (`guarded=False`): the execute
path does so only when its policy (app.jobs.guards) has that guard off, which
only the fault suite does, to show the duplicates they prevent.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from app.platform.database import Prepared

UUIDS = ARRAY(UUID(as_uuid=True))


@dataclass(frozen=True)
class ClaimedJob:
    id: uuid.UUID
    model: str
    model_version: str
    inputs: dict[str, Any] | None  # JSON, for rows written before input_data
    input_data: bytes | None
    attempt: int
    max_attempts: int
    batch_id: uuid.UUID | None = None  # a chunk of this batch
    input_file_id: uuid.UUID | None = None  # its rows are in this file, from input_offset
    input_offset: int | None = None
    input_key: str | None = None  # the file store's object its rows are in
    batch_index: int | None = None
    reply_to: str | None = None  # a sync call's: where its answer is published


@dataclass(frozen=True)
class Outcome:
    """What an attempt came to. `retry` puts the job back in the queue after `delay_s`."""

    job_id: uuid.UUID
    attempt: int
    status: str  # "succeeded", "failed" or "retry"
    output_data: bytes | None = None  # outputs, packed (app.runtime.tensors.pack)
    output_bytes: int | None = None  # a chunk's: the size of its outputs in the file store
    batch_share: float | None = None  # its rows over its micro-batch's
    compute_seconds: float | None = None  # that share of the ONNX Runtime call
    error_code: str | None = None
    error_message: str | None = None
    error_class: str | None = None
    traceback: str | None = None
    delay_s: float = 0.0


_CLAIMED = (
    "id, model, model_version, inputs, input_data, attempts, max_attempts, created_at, batch_id, "
    "input_file_id, input_offset, input_key, batch_index, reply_to"
)
_LEASE = "lease_expires_at = now() + make_interval(secs => :lease)"
_CLAIMABLE = """
    AND ((status = 'queued' AND run_after <= now()) {expired})
    AND attempts < max_attempts
    AND (deadline_at IS NULL OR deadline_at > now())
"""


def claim(
    session: Session,
    job_ids: list[uuid.UUID],
    lease_s: float,
    *,
    guarded: bool = True,
    reclaim_expired: bool = True,
) -> list[ClaimedJob]:
    """Move these jobs to running under a lease, where claimable; returns those
    this call won, in the order of `job_ids`.

    Claimable: queued and due, or running with a lease that ran out (its worker
    died), within the attempt cap and the deadline.
    """
    expired = "OR (status = 'running' AND lease_expires_at < now())" if reclaim_expired else ""
    where = _CLAIMABLE.format(expired=expired) if guarded else ""
    statement = text(
        f"""
        UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = now(), {_LEASE}
        WHERE id = ANY(:ids) {where}
        RETURNING {_CLAIMED}
        """
    ).bindparams(bindparam("ids", type_=UUIDS))
    position = {job_id: i for i, job_id in enumerate(job_ids)}
    # RETURNING has no order; callers (a batch streaming results) keep theirs.
    rows = sorted(
        session.execute(statement, {"ids": job_ids, "lease": lease_s}), key=lambda r: position[r.id]
    )
    return [_claimed(r) for r in rows]


def claim_next(
    session: Session, model: str, max_rows: int, lease_s: float, *, guarded: bool = True
) -> tuple[list[ClaimedJob], bool]:
    """Claim queued, due jobs of `model` whose rows fit in `max_rows` (a job bigger
    than that alone), under a lease, fairly between tenants. Returns them in the
    order taken, and whether more were waiting.

    Fair dispatch: higher `priority` first; within a priority, tenants take turns
    (each tenant's oldest, then each one's second oldest, ...), so one tenant's
    flood of queued jobs delays another tenant's next job by about one turn, not
    by the whole flood. The tenants come from a skip scan of ix_jobs_claim (one
    index probe per tenant with queued jobs of the model), each tenant's head of
    the queue from the same index: the cost grows with the number of tenants
    waiting, never with the length of the queue.

    SKIP LOCKED lets worker processes claim side by side without waiting on each
    other; candidates left over are unlocked when this transaction commits.
    Unguarded (the fault suite only) a running job can be claimed again.

    A job back from a worker that died running it (`worker_lost`) is claimed
    alone: if its own rows killed the process (the OOM killer), its next
    attempts kill only it, not the jobs beside it, which would otherwise use
    up their attempts with it and be dead-lettered for its rows.
    """
    params = {"model": model, "max_rows": max_rows, "lease": lease_s,
              "per_tenant": 2 * max_rows}  # fmt: skip
    rows = sorted(claim_next_statement(guarded).execute(session, params), key=lambda r: r.position)
    more = bool(rows) and (rows[0].candidates > len(rows) or len(rows) == max_rows)
    return [_claimed(r) for r in rows], more


@functools.cache
def claim_next_statement(guarded: bool = True) -> Prepared:
    """claim_next's statement; params model, max_rows, per_tenant and lease. Made
    once per process (parsing its text was 6% of a worker's CPU on one-row jobs)
    and prepared once per connection (planning it took 0.7 ms of PostgreSQL's CPU
    a call, more than running it)."""
    waiting = "status = 'queued'" if guarded else "status IN ('queued', 'running')"

    def due(table: str) -> str:
        return f"{table}.{waiting}" + (f" AND {table}.run_after <= now()" if guarded else "")

    return Prepared(
        "claim_next" if guarded else "claim_next_unguarded",
        f"""
        WITH RECURSIVE tenants AS (  -- ordered as ix_jobs_claim is, so it walks that index
            (SELECT tenant_id FROM jobs WHERE model = :model AND {waiting}
             ORDER BY tenant_id, priority DESC, created_at LIMIT 1)
            UNION ALL
            SELECT (SELECT j.tenant_id FROM jobs j
                    WHERE j.model = :model AND j.{waiting} AND j.tenant_id > t.tenant_id
                    ORDER BY j.tenant_id, j.priority DESC, j.created_at LIMIT 1)
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        ),
        heads AS (  -- each tenant's next jobs; the spare covers rows others hold locked
            SELECT h.id, h.priority, h.created_at,
                   row_number() OVER (PARTITION BY t.tenant_id, h.priority
                                      ORDER BY h.created_at) AS turn
            FROM tenants t CROSS JOIN LATERAL (
                SELECT id, priority, created_at FROM jobs
                WHERE model = :model AND tenant_id = t.tenant_id AND {due("jobs")}
                  AND attempts < max_attempts AND (deadline_at IS NULL OR deadline_at > now())
                ORDER BY priority DESC, created_at LIMIT :per_tenant
            ) AS h
            WHERE t.tenant_id IS NOT NULL
        ),
        candidates AS (  -- locked in turn order, one primary-key probe each, until enough
            SELECT h.id, j.rows, h.priority, h.turn, h.created_at
            FROM (SELECT * FROM heads ORDER BY priority DESC, turn, created_at, id) AS h
            CROSS JOIN LATERAL (  -- a job its worker died running fills a claim alone
                SELECT CASE WHEN j.error_code = 'worker_lost' THEN :max_rows + 1
                            ELSE j.batch_rows END AS rows
                FROM jobs j WHERE j.id = h.id AND {due("j")}
                FOR UPDATE SKIP LOCKED
            ) AS j
            LIMIT :max_rows
        ),
        picked AS (
            SELECT pid, position FROM (
                SELECT id AS pid, sum(rows) OVER w AS running,
                       row_number() OVER w AS position
                FROM candidates
                WINDOW w AS (ORDER BY priority DESC, turn, created_at, id)
            ) AS c
            WHERE running <= :max_rows OR position = 1
        )
        UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = now(), {_LEASE}
        FROM picked
        WHERE jobs.id = picked.pid
        RETURNING {_CLAIMED}, picked.position, (SELECT count(*) FROM candidates) AS candidates
        """,
        {"model": "text", "max_rows": "integer", "per_tenant": "integer", "lease": "float8"},
    )


def _claimed(r: Any) -> ClaimedJob:
    return ClaimedJob(
        r.id, r.model, r.model_version, r.inputs, r.input_data, r.attempts, r.max_attempts,
        r.batch_id, r.input_file_id, r.input_offset, r.input_key, r.batch_index, r.reply_to,
    )  # fmt: skip


def renew_leases(session: Session, jobs: list[ClaimedJob], lease_s: float) -> set[uuid.UUID]:
    """Extend the leases this worker still holds; returns the ids still owned."""
    statement = text(
        """
        UPDATE jobs SET lease_expires_at = now() + make_interval(secs => :lease)
        FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[])) AS o(id, attempt)
        WHERE jobs.id = o.id AND jobs.status = 'running' AND jobs.attempts = o.attempt
        RETURNING jobs.id
        """
    )
    params = {
        "ids": [str(j.id) for j in jobs],
        "attempts": [j.attempt for j in jobs],
        "lease": lease_s,
    }
    owned = {r.id for r in session.execute(statement, params)}
    return owned


# Dead letters for the rows a CTE named `moved` returned with status 'failed'.
_DEAD_LETTERS = """
    dead AS (
        INSERT INTO dead_letters (job_id, tenant_id, model, model_version, error_code,
                                  error_class, message, traceback, attempts,
                                  first_failed_at, last_failed_at)
        SELECT id, tenant_id, model, model_version, error_code, error_class,
               coalesce(error_message, ''), traceback, attempts,
               coalesce(first_failed_at, now()), now()
        FROM moved WHERE status = 'failed'
    )
"""


_OWNED = "AND j.status = 'running' AND j.attempts = v.attempt"


def finish(session: Session, outcomes: list[Outcome], *, guarded: bool = True) -> set[uuid.UUID]:
    """Write every outcome in one statement; returns the ids whose outcome was written."""
    return {row.id for row in finish_rows(session, outcomes, guarded=guarded)}


def finish_rows(session: Session, outcomes: list[Outcome], *, guarded: bool = True) -> list[Any]:
    """`finish`, returning each written job's id, model, tenant_id, status,
    error_code, and its time queued and running (`queued_s`, `running_s`): what
    the worker's metrics and log lines need, with no query of their own.

    Only the attempt that claimed a job, while the job is still running, can
    write it, so a late or duplicate writer changes nothing. A job whose
    cancellation was requested while it ran ends `cancelled` and keeps no result.
    """
    if not outcomes:
        return []
    params = {
        "ids": [str(o.job_id) for o in outcomes],
        "attempts": [o.attempt for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "output_data": [o.output_data for o in outcomes],
        "output_bytes": [o.output_bytes for o in outcomes],
        "codes": [o.error_code for o in outcomes],
        "messages": [o.error_message for o in outcomes],
        "classes": [o.error_class for o in outcomes],
        "tracebacks": [o.traceback for o in outcomes],
        "delays": [o.delay_s for o in outcomes],
        "shares": [o.batch_share for o in outcomes],
        "computes": [o.compute_seconds for o in outcomes],
    }
    return list(_finish_statement(guarded).execute(session, params))


@functools.cache
def _finish_statement(guarded: bool) -> Prepared:
    """finish_rows' statement, prepared once per connection: a statement whose
    arrays are sent as ARRAY[...] lists is a new text for each length, so
    PostgreSQL planned it at every call (0.3 ms of its CPU)."""
    return Prepared(
        "finish" if guarded else "finish_unguarded",
        f"""
        WITH v AS (
            SELECT * FROM unnest(
                :ids, :attempts, :statuses, :output_data, :output_bytes, :codes, :messages,
                :classes, :tracebacks, :delays, :shares, :computes
            ) AS v(id, attempt, status, output_data, output_bytes, error_code, error_message,
                   error_class, traceback, delay, share, compute)
        ),
        moved AS (
            UPDATE jobs AS j SET
                status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                              WHEN v.status = 'retry' THEN 'queued' ELSE v.status END,
                output_data = CASE WHEN j.cancel_requested_at IS NULL THEN v.output_data END,
                output_bytes = CASE WHEN j.cancel_requested_at IS NULL THEN v.output_bytes END,
                batch_share = coalesce(v.share, j.batch_share),
                compute_seconds = CASE WHEN v.compute IS NULL THEN j.compute_seconds
                                       ELSE coalesce(j.compute_seconds, 0) + v.compute END,
                error_code = v.error_code, error_message = v.error_message,
                finished_at = CASE WHEN v.status = 'retry' AND j.cancel_requested_at IS NULL
                                   THEN NULL ELSE now() END,
                lease_expires_at = NULL,
                enqueued_at = CASE WHEN v.status = 'retry' THEN NULL ELSE j.enqueued_at END,
                run_after = CASE WHEN v.status = 'retry'
                                 THEN now() + make_interval(secs => v.delay) ELSE j.run_after END,
                first_failed_at = CASE WHEN v.status = 'succeeded' THEN j.first_failed_at
                                       ELSE coalesce(j.first_failed_at, now()) END
            FROM v
            WHERE j.id = v.id {_OWNED if guarded else ""}
            RETURNING j.id, j.status, j.tenant_id, j.model, j.model_version, j.attempts,
                      j.first_failed_at, j.error_code, j.error_message, v.error_class,
                      v.traceback, extract(epoch FROM j.started_at - j.created_at) AS queued_s,
                      extract(epoch FROM j.finished_at - j.started_at) AS running_s
        ),
        {_DEAD_LETTERS}
        SELECT id, model, tenant_id, status, error_code, queued_s, running_s FROM moved
        """,
        {"ids": "uuid[]", "attempts": "integer[]", "statuses": "text[]",
         "output_data": "bytea[]", "output_bytes": "bigint[]", "codes": "text[]",
         "messages": "text[]", "classes": "text[]", "tracebacks": "text[]",
         "delays": "float8[]", "shares": "float8[]", "computes": "float8[]"},
    )  # fmt: skip


def take_back_expired_leases(
    session: Session, backoff_s: float, backoff_max_s: float, limit: int
) -> list[uuid.UUID]:
    """Jobs whose worker died (lease ran out): queue them again after a backoff, or
    fail them once they used up their attempts. Returns the ids queued again."""
    statement = text(
        f"""
        WITH lost AS (
            SELECT id FROM jobs WHERE status = 'running' AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT :limit FOR UPDATE SKIP LOCKED
        ),
        moved AS (
            UPDATE jobs AS j SET
                status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                              WHEN j.attempts >= j.max_attempts THEN 'failed'
                              ELSE 'queued' END,
                error_code = CASE WHEN j.attempts >= j.max_attempts
                                  THEN 'attempts_exhausted' ELSE 'worker_lost' END,
                error_message = format('the worker running attempt %s of %s stopped '
                                       'answering (lease expired)', j.attempts, j.max_attempts),
                lease_expires_at = NULL, enqueued_at = NULL,
                run_after = now() + make_interval(secs => least(
                    CAST(:cap AS float8),
                    CAST(:base AS float8) * power(2, greatest(j.attempts - 1, 0))) * random()),
                finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                                     OR j.attempts >= j.max_attempts THEN now() END,
                first_failed_at = coalesce(j.first_failed_at, now())
            FROM lost WHERE j.id = lost.id
            RETURNING j.id, j.status, j.tenant_id, j.model, j.model_version, j.attempts,
                      j.first_failed_at, j.error_code, j.error_message,
                      'WorkerLost' AS error_class, NULL AS traceback
        ),
        {_DEAD_LETTERS}
        SELECT id FROM moved WHERE status = 'queued'
        """
    )
    params = {"limit": limit, "base": backoff_s, "cap": backoff_max_s}
    ids = [r.id for r in session.execute(statement, params)]
    return ids


def models_waiting(session: Session, older_than_s: float) -> dict[str, int]:
    """Models with due queued jobs that no wake-up may be on its way for: jobs back
    from a retry's backoff or a failed publish (`enqueued_at` NULL; now marked sent),
    and jobs queued longer than `older_than_s` (a wake-up lost with the broker).
    Returns how many such jobs each model has."""
    statement = text(
        """
        WITH unsent AS (
            UPDATE jobs SET enqueued_at = now()
            WHERE id IN (
                SELECT id FROM jobs
                WHERE status = 'queued' AND enqueued_at IS NULL AND run_after <= now()
                LIMIT 5000 FOR UPDATE SKIP LOCKED
            )
            RETURNING model
        ),
        stale AS (
            SELECT model FROM jobs
            WHERE status = 'queued' AND enqueued_at < now() - make_interval(secs => :age)
              AND run_after <= now()
        )
        SELECT model, count(*) AS jobs FROM (
            SELECT model FROM unsent UNION ALL SELECT model FROM stale
        ) AS waiting GROUP BY model
        """
    )
    waiting = {r.model: r.jobs for r in session.execute(statement, {"age": older_than_s})}
    return waiting


MARK_UNSENT = text(
    "UPDATE jobs SET enqueued_at = NULL WHERE id = ANY(:ids) AND status = 'queued'"
).bindparams(bindparam("ids", type_=UUIDS))


def mark_unsent(session: Session, job_ids: list[uuid.UUID]) -> None:
    """The wake-up failed: the sweep wakes these jobs' model at its next run."""
    session.execute(MARK_UNSENT, {"ids": job_ids})


def expire_overdue(session: Session, limit: int) -> int:
    """Jobs past their deadline end `expired`; a worker still running one cannot
    write its result afterwards (the finish guard wants `running`)."""
    statement = text(
        """
        UPDATE jobs SET status = 'expired', finished_at = now(), lease_expires_at = NULL,
               error_code = 'deadline_exceeded',
               error_message = format('not finished by its deadline %s', deadline_at)
        WHERE id IN (
            SELECT id FROM jobs
            WHERE status IN ('queued', 'running') AND deadline_at < now()
            LIMIT :limit FOR UPDATE SKIP LOCKED
        )
        RETURNING id
        """
    )
    count = len(session.execute(statement, {"limit": limit}).all())
    return count


def purge_old_data(session: Session, older_than_s: float, limit: int) -> int:
    """Delete inputs and outputs of jobs finished long ago; keep their metadata."""
    statement = text(
        """
        UPDATE jobs SET inputs = NULL, input_data = NULL, outputs = NULL, output_data = NULL,
               purged_at = now()
        WHERE id IN (
            SELECT id FROM jobs
            WHERE purged_at IS NULL AND finished_at < now() - make_interval(secs => :age)
            LIMIT :limit FOR UPDATE SKIP LOCKED
        )
        RETURNING id
        """
    )
    count = len(session.execute(statement, {"age": older_than_s, "limit": limit}).all())
    return count


def request_cancel(session: Session, tenant_id: int, job_id: uuid.UUID) -> str | None:
    """Cancel a queued job now, or ask a running one to stop at its next checkpoint.

    Returns the job's status afterwards, or None if it was not queued or running.
    """
    statement = text(
        """
        UPDATE jobs SET cancel_requested_at = now(),
               status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
               finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END
        WHERE id = :id AND tenant_id = :tenant AND status IN ('queued', 'running')
        RETURNING status
        """
    )
    status = session.execute(statement, {"id": job_id, "tenant": tenant_id}).scalar()
    return status


_REQUEST_CANCEL_MANY = text(
    """
    UPDATE jobs SET cancel_requested_at = now(),
           status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
           finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END
    WHERE id = ANY(:ids) AND tenant_id = :tenant AND status IN ('queued', 'running')
    """
).bindparams(bindparam("ids", type_=UUIDS))


def request_cancel_many(session: Session, tenant_id: int, job_ids: list[uuid.UUID]) -> int:
    """`request_cancel` for many of a tenant's jobs in one statement; how many were
    queued or running."""
    result = session.execute(_REQUEST_CANCEL_MANY, {"ids": job_ids, "tenant": tenant_id})
    return int(result.rowcount)  # type: ignore[attr-defined]
