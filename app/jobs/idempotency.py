"""`Idempotency-Key` on POST /jobs: a retried request gets the job it already made.

Keys are scoped to the tenant and kept 24 hours. The same key with the same
request returns the first job; with a different request it is a 422; while the
first request holding the key has not finished, a repeat is a 409. A
transaction-scoped advisory lock on (tenant, key) decides who holds the key, so
any number of concurrent repeats create exactly one job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from app.cards import ModelCard
from app.errors import Conflict, DomainError, InvalidRequest, NotFound
from app.jobs.reads import get_many
from app.jobs.staging import fingerprint
from app.jobs.tables import IdempotencyKey, Job

TTL_HOURS = 24


def claim(session: Session, tenant_id: int, key: str, request_hash: str) -> uuid.UUID | None:
    """Hold the key for this transaction; returns the job an earlier request made.
    Raises when the key is held or was used otherwise (the unit of work then rolls
    back, releasing the lock)."""
    earlier = claim_many(session, tenant_id, {key: request_hash})[key]
    if isinstance(earlier, DomainError):
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
    session: Session, tenant_id: int, key: str, request_hash: str, job_id: uuid.UUID
) -> None:
    session.add(
        IdempotencyKey(tenant_id=tenant_id, key=key, request_hash=request_hash, job_id=job_id)
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


class Keyed(Protocol):
    """What a bulk submit's request says that its key depends on."""

    @property
    def model(self) -> str: ...
    @property
    def version(self) -> str | None: ...
    @property
    def inputs(self) -> Any: ...
    @property
    def parameters(self) -> Any: ...
    @property
    def idempotency_key(self) -> str | None: ...


# A request of a bulk submit that passed its checks: its place, its card, its arrays.
Checked = tuple[int, ModelCard, dict[str, Any]]


class BulkKeys:
    """The idempotency keys of a bulk submit: the first use of each key is claimed
    (its earlier job returned instead of a new one), later uses of the same key
    in the list repeat the first's outcome, or are an error for another request."""

    def __init__(self, requests: Sequence[Keyed], checked: list[Checked], field: str) -> None:
        self._requests, self._checked, self._field = requests, checked, field
        self._first: dict[str, int] = {}  # key: the request that uses it first
        self._prints: dict[str, str] = {}
        # (request, the first with its key; None: that key's first use was another request)
        self._repeats: list[tuple[int, int | None]] = []
        self._unkeyed: list[Checked] = []
        self._keyed: list[Checked] = []
        for item in checked:
            request = requests[item[0]]
            key = request.idempotency_key
            if key is None:
                self._unkeyed.append(item)
                continue
            print_ = fingerprint(request.model, request.version, request.inputs,
                                 request.parameters)  # fmt: skip
            if key in self._first:
                same = self._prints[key] == print_
                self._repeats.append((item[0], self._first[key] if same else None))
                continue
            self._first[key], self._prints[key] = item[0], print_
            self._keyed.append(item)

    @property
    def none(self) -> bool:
        """No request of the list has a key."""
        return not self._keyed and not self._repeats

    def claim(
        self, session: Session, tenant_id: int, outcomes: list[Job | DomainError | None]
    ) -> list[Checked]:
        """Hold the keys; what is left to stage, in request order. A key's earlier
        job (or its refusal) becomes that request's outcome at once."""
        if not self._keyed:
            return self._checked
        claimed = claim_many(session, tenant_id, self._prints, self._field)
        earlier: dict[uuid.UUID, Job | None] = {
            job_id: None for job_id in claimed.values() if isinstance(job_id, uuid.UUID)
        }
        if earlier:
            for job in get_many(session, tenant_id, list(earlier)):
                earlier[job.id] = job
        left = list(self._unkeyed)
        for item in self._keyed:
            key = self._requests[item[0]].idempotency_key
            assert key is not None
            outcome = claimed[key]
            if outcome is None:
                left.append(item)
            elif isinstance(outcome, DomainError):
                outcomes[item[0]] = outcome
            else:
                outcomes[item[0]] = earlier[outcome] or NotFound(
                    f"the job this {self._field} made ({outcome}) is gone",
                    errors={self._field: ["its job was deleted; use a new key"]},
                )
        return sorted(left, key=lambda item: item[0])

    def remember(self, session: Session, tenant_id: int, order: list[int], jobs: list[Job]) -> None:
        """Record the keys of the new jobs, in their transaction."""
        for index, job in zip(order, jobs, strict=True):
            key = self._requests[index].idempotency_key
            if key is not None:
                remember(session, tenant_id, key, self._prints[key], job.id)

    def repeat(self, outcomes: list[Job | DomainError | None]) -> None:
        """A key's later uses: the first's outcome, or an error for another request."""
        for index, first in self._repeats:
            outcomes[index] = (
                outcomes[first] if first is not None
                else InvalidRequest(
                    f"this {self._field} is used earlier in the list with a different "
                    "request; give each request its own key",
                    errors={self._field: ["already used with a different request body"]},
                )
            )  # fmt: skip
