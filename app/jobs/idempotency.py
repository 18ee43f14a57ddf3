"""`Idempotency-Key` on POST /jobs: a retried request gets the job it already made.

Keys are scoped to the tenant and kept 24 hours. The same key with the same
request returns the first job; with a different request it is a 422; while the
first request holding the key has not finished, a repeat is a 409. A
transaction-scoped advisory lock on (tenant, key) decides who holds the key, so
any number of concurrent repeats create exactly one job.
"""

from __future__ import annotations

import uuid

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from app.errors import Conflict, DomainError, InvalidRequest
from app.jobs.tables import IdempotencyKey

TTL_HOURS = 24


def claim(session: Session, tenant_id: int, key: str, fingerprint: str) -> uuid.UUID | None:
    """Hold the key for this transaction; returns the job an earlier request made.
    Raises (the transaction rolled back) when the key is held or was used otherwise."""
    earlier = claim_many(session, tenant_id, {key: fingerprint})[key]
    if isinstance(earlier, DomainError):
        session.rollback()
        raise earlier
    return earlier


def claim_many(
    session: Session, tenant_id: int, keys: dict[str, str], field: str = "Idempotency-Key"
) -> dict[str, uuid.UUID | DomainError | None]:
    """`claim` for many keys (key: the request's fingerprint) in one round of
    statements, for a bulk submit: each key's earlier job, None for a new key,
    or its own error (held by a request in flight; used with another request).
    Try-locks never wait, so two bulks sharing keys cannot deadlock."""
    names = list(keys)
    locks = session.execute(
        text(
            "SELECT k, pg_try_advisory_xact_lock(hashtextextended(:t || ':' || k, 0)) "
            "FROM unnest(CAST(:keys AS text[])) AS k"
        ),
        {"t": str(tenant_id), "keys": names},
    )
    held: dict[str, bool] = {key: bool(taken) for key, taken in locks}
    mine = [key for key in names if held[key]]
    session.execute(
        text(
            "DELETE FROM idempotency_keys WHERE tenant_id = :t AND key = ANY(:k) "
            f"AND created_at < now() - interval '{TTL_HOURS} hours'"
        ),
        {"t": tenant_id, "k": mine},
    )
    earlier = {
        row.key: row
        for row in session.scalars(
            select(IdempotencyKey).where(
                IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key.in_(mine)
            )
        )
    }
    claimed: dict[str, uuid.UUID | DomainError | None] = {}
    for key in names:
        row = earlier.get(key)
        if not held[key]:
            claimed[key] = Conflict(
                f"a request with this {field} is still being processed; retry shortly",
                retry_after=1,
            )
        elif row is not None and row.request_hash != keys[key]:
            claimed[key] = InvalidRequest(
                f"this {field} was used with a different request; use a new key for a new request",
                errors={field: ["already used with a different request body"]},
            )
        else:
            claimed[key] = row.job_id if row is not None else None
    return claimed


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
