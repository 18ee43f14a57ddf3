"""`Idempotency-Key` on POST /jobs: a retried request gets the job it already made.

Keys are scoped to the tenant and kept 24 hours. The same key with the same
request returns the first job; with a different request it is a 422; while the
first request holding the key has not finished, a repeat is a 409. A
transaction-scoped advisory lock on (tenant, key) decides who holds the key, so
any number of concurrent repeats create exactly one job.
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.errors import Conflict, InvalidRequest
from app.platform.tables import IdempotencyKey

TTL_HOURS = 24


def claim(session: Session, tenant_id: int, key: str, fingerprint: str) -> uuid.UUID | None:
    """Hold the key for this transaction; returns the job an earlier request made."""
    held = session.scalar(
        text("SELECT pg_try_advisory_xact_lock(hashtextextended(:k, 0))"),
        {"k": f"{tenant_id}:{key}"},
    )
    if not held:
        session.rollback()
        raise Conflict(
            "a request with this Idempotency-Key is still being processed; retry shortly",
            retry_after=1,
        )
    session.execute(
        text(
            "DELETE FROM idempotency_keys WHERE tenant_id = :t AND key = :k "
            f"AND created_at < now() - interval '{TTL_HOURS} hours'"
        ),
        {"t": tenant_id, "k": key},
    )
    earlier = session.get(IdempotencyKey, (tenant_id, key))
    if earlier is None:
        return None
    if earlier.request_hash != fingerprint:
        session.rollback()
        raise InvalidRequest(
            "this Idempotency-Key was used with a different request; use a new key "
            "for a new request",
            errors={"Idempotency-Key": ["already used with a different request body"]},
        )
    return earlier.job_id


def remember(
    session: Session, tenant_id: int, key: str, fingerprint: str, job_id: uuid.UUID
) -> None:
    session.add(
        IdempotencyKey(tenant_id=tenant_id, key=key, request_hash=fingerprint, job_id=job_id)
    )


def forget_expired(session: Session) -> int:
    count = len(
        session.execute(
            text(
                f"DELETE FROM idempotency_keys WHERE created_at < now() - interval "
                f"'{TTL_HOURS} hours' RETURNING key"
            )
        ).all()
    )
    return count
