"""Dead letters: failed jobs, and webhook deliveries that used up their schedule,
which a person can list, replay (same job id; same webhook-id) or purge.

A replay is one statement that marks the letter replayed (only if it was not)
and puts its job back in the queue with a fresh attempt budget, so of two
concurrent replays of one letter exactly one wins; the other gets 409. Replays
and purges are written to the audit log.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Select, delete, select, text
from sqlalchemy.orm import Session

from app.errors import Conflict, NotFound
from app.jobs.tables import AuditEvent, DeadLetter


@dataclass(frozen=True)
class Filters:
    model: str | None = None
    error_code: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    replayed: bool | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        if self.model:
            query = query.where(DeadLetter.model == self.model)
        if self.error_code:
            query = query.where(DeadLetter.error_code == self.error_code)
        if self.since:
            query = query.where(DeadLetter.created_at >= self.since)
        if self.until:
            query = query.where(DeadLetter.created_at < self.until)
        if self.replayed is not None:
            query = query.where(DeadLetter.replayed_at.is_not(None) == self.replayed)
        return query


def list_letters(
    session: Session, tenant_id: int, filters: Filters, limit: int, before_id: int | None
) -> tuple[list[DeadLetter], int | None]:
    """Newest first; the next page starts below the last id returned."""
    query = filters.apply(select(DeadLetter).where(DeadLetter.tenant_id == tenant_id))
    if before_id is not None:
        query = query.where(DeadLetter.id < before_id)
    letters = list(session.scalars(query.order_by(DeadLetter.id.desc()).limit(limit + 1)))
    page = letters[:limit]
    return page, (page[-1].id if len(letters) > limit else None)


def get(session: Session, tenant_id: int | None, letter_id: int) -> DeadLetter:
    """The tenant's letter (`tenant_id` None: any tenant's, for operators)."""
    letter = session.get(DeadLetter, letter_id)
    if letter is None or (tenant_id is not None and letter.tenant_id != tenant_id):
        raise NotFound(f"no dead letter with id {letter_id}")
    return letter


_REPLAY = text(
    """
    WITH letters AS (
        UPDATE dead_letters SET replayed_at = now()
        WHERE id = ANY(:ids) AND tenant_id = :tenant AND replayed_at IS NULL
          AND delivery_id IS NULL AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = dead_letters.job_id
                      AND jobs.status = 'failed' AND jobs.purged_at IS NULL)
        RETURNING id, job_id
    ),
    jobs_back AS (
        UPDATE jobs SET status = 'queued', attempts = 0, outputs = NULL, error_code = NULL,
               error_message = NULL, started_at = NULL, finished_at = NULL,
               first_failed_at = NULL, lease_expires_at = NULL, cancel_requested_at = NULL,
               enqueued_at = now(), run_after = now()
        FROM letters WHERE jobs.id = letters.job_id AND jobs.status = 'failed'
        RETURNING jobs.id, jobs.model
    )
    SELECT letters.id AS letter_id, letters.job_id, jobs_back.model FROM letters
    JOIN jobs_back ON jobs_back.id = letters.job_id
    """
)


_REPLAY_DELIVERIES = text(
    """
    UPDATE dead_letters SET replayed_at = now()
    WHERE id = ANY(:ids) AND tenant_id = :tenant AND replayed_at IS NULL
      AND delivery_id IS NOT NULL
    RETURNING id AS letter_id, job_id, delivery_id
    """
)


@dataclass(frozen=True)
class Replayed:
    """What a replay queued again: the caller sends `deliveries` again
    (app.webhooks.delivery.redeliver), commits, then wakes `woken`'s models."""

    ids: list[uuid.UUID]  # the jobs of the letters replayed, in order
    woken: dict[str, list[uuid.UUID]]  # model -> its jobs back in the queue
    deliveries: list[int] = field(default_factory=list)  # webhook deliveries to send again


def _replay(session: Session, tenant_id: int, letter_ids: list[int], actor: str) -> Replayed:
    """Failed jobs go back to the queue; undeliverable webhooks are sent again."""
    params = {"ids": letter_ids, "tenant": tenant_id}
    jobs = session.execute(_REPLAY, params).all()
    webhooks = session.execute(_REPLAY_DELIVERIES, params).all()
    for row in [*jobs, *webhooks]:
        session.add(
            AuditEvent(
                tenant_id=tenant_id,
                action="dead_letter.replay",
                subject=f"dead_letter:{row.letter_id}",
                detail={"job_id": str(row.job_id), "by": actor},
            )
        )
    session.flush()
    woken: dict[str, list[uuid.UUID]] = {}
    for row in jobs:
        woken.setdefault(row.model, []).append(row.job_id)
    deliveries = [row.delivery_id for row in webhooks]
    return Replayed([row.job_id for row in [*jobs, *webhooks]], woken, deliveries)


def replay(session: Session, tenant_id: int, letter_id: int, actor: str) -> Replayed:
    """Put the letter's job back in the queue, same id; Conflict if it cannot be."""
    letter = get(session, tenant_id, letter_id)
    replayed = _replay(session, tenant_id, [letter_id], actor)
    if not replayed.ids:
        session.refresh(letter)
        reason = (
            f"it was already replayed at {letter.replayed_at.isoformat()}"
            if letter.replayed_at
            else "its job is no longer failed, or retention deleted its inputs"
        )
        raise Conflict(f"dead letter {letter_id} cannot be replayed: {reason}")
    return replayed


def replay_matching(
    session: Session, tenant_id: int, filters: Filters, limit: int, actor: str
) -> Replayed:
    """Replay every unreplayed letter that matches, oldest first, up to `limit`."""
    query = filters.apply(
        select(DeadLetter.id).where(
            DeadLetter.tenant_id == tenant_id, DeadLetter.replayed_at.is_(None)
        )
    )
    ids = list(session.scalars(query.order_by(DeadLetter.id).limit(limit)))
    return _replay(session, tenant_id, ids, actor) if ids else Replayed([], {})


def purge(session: Session, tenant_id: int, letter_id: int, actor: str) -> None:
    letter = get(session, tenant_id, letter_id)
    session.execute(delete(DeadLetter).where(DeadLetter.id == letter.id))
    session.add(
        AuditEvent(
            tenant_id=tenant_id,
            action="dead_letter.purge",
            subject=f"dead_letter:{letter_id}",
            detail={"job_id": str(letter.job_id), "error_code": letter.error_code, "by": actor},
        )
    )
