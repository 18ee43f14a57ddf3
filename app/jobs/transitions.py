"""Guarded state changes on the job row.

Every change is one conditional UPDATE whose WHERE clause names the state it
leaves (and, when finishing, the attempt that claimed the job). Celery may
deliver a message twice; the second delivery then matches no row, so it can
neither run a job another worker owns nor write a second result.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class ClaimedJob:
    id: uuid.UUID
    model: str
    model_version: str
    inputs: dict[str, Any]
    attempt: int


@dataclass(frozen=True)
class Outcome:
    job_id: uuid.UUID
    attempt: int
    status: str  # "succeeded" or "failed"
    outputs: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None


_CLAIM = text(
    """
    UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = now()
    WHERE id = ANY(:ids) AND status = 'queued'
    RETURNING id, model, model_version, inputs, attempts
    """
).bindparams(bindparam("ids", type_=ARRAY(UUID(as_uuid=True))))


def claim(session: Session, job_ids: list[uuid.UUID]) -> list[ClaimedJob]:
    """Move queued jobs to running, in one statement; returns those this call won."""
    rows = session.execute(_CLAIM, {"ids": job_ids}).all()
    session.commit()
    return [ClaimedJob(r.id, r.model, r.model_version, r.inputs, r.attempts) for r in rows]


def finish(session: Session, outcomes: list[Outcome]) -> set[uuid.UUID]:
    """Write every outcome in one statement; returns the ids whose result was written.

    A job is only finished by the attempt that claimed it and only while it is
    still running, so a late or duplicate writer changes nothing.
    """
    if not outcomes:
        return set()
    rows, params = [], {}
    for i, o in enumerate(outcomes):
        rows.append(
            f"(CAST(:id{i} AS uuid), CAST(:at{i} AS integer), CAST(:st{i} AS text), "
            f"CAST(:out{i} AS jsonb), CAST(:ec{i} AS text), CAST(:em{i} AS text))"
        )
        params.update(
            {
                f"id{i}": str(o.job_id),
                f"at{i}": o.attempt,
                f"st{i}": o.status,
                f"out{i}": None if o.outputs is None else json.dumps(o.outputs),
                f"ec{i}": o.error_code,
                f"em{i}": o.error_message,
            }
        )
    statement = text(
        f"""
        UPDATE jobs AS j SET status = v.status, outputs = v.outputs, error_code = v.error_code,
               error_message = v.error_message, finished_at = now()
        FROM (VALUES {", ".join(rows)})
             AS v(id, attempt, status, outputs, error_code, error_message)
        WHERE j.id = v.id AND j.status = 'running' AND j.attempts = v.attempt
        RETURNING j.id
        """
    )
    written = {r.id for r in session.execute(statement, params)}
    session.commit()
    return written


_STALE_QUEUED = text(
    """
    UPDATE jobs SET enqueued_at = now()
    WHERE id IN (
        SELECT id FROM jobs
        WHERE status = 'queued' AND enqueued_at < now() - make_interval(secs => :age)
        ORDER BY enqueued_at LIMIT :limit FOR UPDATE SKIP LOCKED
    )
    RETURNING id
    """
)


def take_stale_queued(session: Session, older_than_s: float, limit: int) -> list[uuid.UUID]:
    """Queued jobs nobody picked up in time (a lost publish, a flushed broker)."""
    ids = [r.id for r in session.execute(_STALE_QUEUED, {"age": older_than_s, "limit": limit})]
    session.commit()
    return ids
