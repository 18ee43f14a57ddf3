"""Guarded state changes on the job row.

Every change is one conditional UPDATE whose WHERE clause names the state it
leaves and, for a running job, the attempt that owns it. Celery may deliver a
message twice; the second delivery then matches no row, so it can neither run
a job another worker owns nor write a second result. A job that fails is given
its dead letter in the same statement.

The claim (app.jobs.claims) and `finish` checks can be left out
(`guarded=False`): the execute path does so only when its policy
(app.jobs.guards) has that guard off, which only the fault suite does, to show
the duplicates they prevent.
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
from app.statuses import OPEN_SQL

UUIDS = ARRAY(UUID(as_uuid=True))


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
    prompt_tokens: int | None = None  # a generation's
    completion_tokens: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_class: str | None = None
    traceback: str | None = None
    delay_s: float = 0.0


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
    cancellation was requested while it ran ends `cancelled` and keeps no result,
    unless the attempt stopped for the cancel with what it had (a generation's text).
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
        "prompts": [o.prompt_tokens for o in outcomes],
        "completions": [o.completion_tokens for o in outcomes],
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
                :classes, :tracebacks, :delays, :shares, :computes, :prompts, :completions
            ) AS v(id, attempt, status, output_data, output_bytes, error_code, error_message,
                   error_class, traceback, delay, share, compute, prompt_tokens,
                   completion_tokens)
        ),
        moved AS (
            UPDATE jobs AS j SET
                status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                              WHEN v.status = 'retry' THEN 'queued' ELSE v.status END,
                output_data = CASE WHEN j.cancel_requested_at IS NULL OR v.status = 'cancelled'
                                   THEN v.output_data END,
                output_bytes = CASE WHEN j.cancel_requested_at IS NULL THEN v.output_bytes END,
                batch_share = coalesce(v.share, j.batch_share),
                compute_seconds = CASE WHEN v.compute IS NULL THEN j.compute_seconds
                                       ELSE coalesce(j.compute_seconds, 0) + v.compute END,
                prompt_tokens = coalesce(v.prompt_tokens, j.prompt_tokens),
                completion_tokens = coalesce(v.completion_tokens, j.completion_tokens),
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
         "delays": "float8[]", "shares": "float8[]", "computes": "float8[]",
         "prompts": "integer[]", "completions": "integer[]"},
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
        f"""
        UPDATE jobs SET status = 'expired', finished_at = now(), lease_expires_at = NULL,
               error_code = 'deadline_exceeded',
               error_message = format('not finished by its deadline %s', deadline_at)
        WHERE id IN (
            SELECT id FROM jobs
            WHERE status IN ({OPEN_SQL}) AND deadline_at < now()
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


def erase(session: Session, tenant_id: int, job_id: uuid.UUID) -> bool:
    """Delete a finished job's inputs, outputs and recorded pieces now, as the
    retention purge does later (a response its owner deleted); its row stays."""
    erased = session.execute(
        text(
            """
            UPDATE jobs SET inputs = NULL, input_data = NULL, outputs = NULL,
                   output_data = NULL, purged_at = now()
            WHERE id = :id AND tenant_id = :tenant AND finished_at IS NOT NULL
            RETURNING id
            """
        ),
        {"id": job_id, "tenant": tenant_id},
    ).scalar()
    if erased is not None:
        session.execute(text("DELETE FROM job_events WHERE job_id = :id AND status = 'output'"),
                        {"id": job_id})  # fmt: skip
    return erased is not None


def request_cancel(session: Session, tenant_id: int, job_id: uuid.UUID) -> str | None:
    """Cancel a queued job now, or ask a running one to stop at its next checkpoint.

    Returns the job's status afterwards, or None if it was not queued or running.
    """
    statement = text(
        f"""
        UPDATE jobs SET cancel_requested_at = now(),
               status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
               finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END
        WHERE id = :id AND tenant_id = :tenant AND status IN ({OPEN_SQL})
        RETURNING status
        """
    )
    status = session.execute(statement, {"id": job_id, "tenant": tenant_id}).scalar()
    return status


_REQUEST_CANCEL_MANY = text(
    f"""
    UPDATE jobs SET cancel_requested_at = now(),
           status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
           finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END
    WHERE id = ANY(:ids) AND tenant_id = :tenant AND status IN ({OPEN_SQL})
    """
).bindparams(bindparam("ids", type_=UUIDS))


def request_cancel_many(session: Session, tenant_id: int, job_ids: list[uuid.UUID]) -> int:
    """`request_cancel` for many of a tenant's jobs in one statement; how many were
    queued or running."""
    result = session.execute(_REQUEST_CANCEL_MANY, {"ids": job_ids, "tenant": tenant_id})
    return int(result.rowcount)  # type: ignore[attr-defined]
