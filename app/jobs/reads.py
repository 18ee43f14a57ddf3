"""Reading a tenant's jobs: one, many, a page of them, and waiting for one to
change or finish (holding no connection while it waits)."""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text, tuple_
from sqlalchemy.orm import Session, defer, undefer

from app.errors import InvalidRequest, MalformedRequest, NotFound
from app.jobs.events import EventBus
from app.jobs.tables import Job
from app.platform.orm import owned
from app.statuses import TERMINAL


def get(session: Session, tenant_id: int, job_id: uuid.UUID) -> Job:
    """The tenant's job, outputs loaded; another tenant's job is indistinguishable
    from a missing one."""
    return owned(session, Job, tenant_id, job_id, "job", options=[undefer(Job.output_data)])


def get_many(session: Session, tenant_id: int, job_ids: list[uuid.UUID]) -> list[Job]:
    """The tenant's jobs among `job_ids`, outputs loaded, in one query (any order;
    another tenant's or a missing id is left out)."""
    query = (
        select(Job)
        .where(Job.tenant_id == tenant_id, Job.id.in_(job_ids))
        .options(undefer(Job.output_data))
    )
    return list(session.scalars(query))


@dataclass
class Page:
    items: list[Job]
    next_cursor: str | None


def list_jobs(
    session: Session,
    tenant_id: int,
    *,
    limit: int,
    status: str | None = None,
    model: str | None = None,
    cursor: str | None = None,
    outputs: bool = False,
) -> Page:
    """Newest first, keyset-paginated on (created_at, id): stable under inserts.
    Inputs are never read; outputs only with `outputs` (200 jobs' outputs can
    be megabytes nobody asked for)."""
    query = select(Job).where(Job.tenant_id == tenant_id, Job.batch_id.is_(None))  # not chunks
    query = query.options(undefer(Job.output_data) if outputs else defer(Job.outputs))
    if status:
        query = query.where(Job.status == status)
    if model:
        query = query.where(Job.model == model)
    if cursor:
        created_at, job_id = _decode_cursor(cursor)
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(created_at, job_id))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    jobs = list(session.scalars(query))
    more = len(jobs) > limit
    items = jobs[:limit]
    return Page(items, _encode_cursor(items[-1]) if more else None)


def _encode_cursor(job: Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, job_id = raw.split("|")
        return datetime.fromisoformat(created), uuid.UUID(job_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest(
            "cursor is not valid; pass the next_cursor value of a previous page unchanged",
            errors={"cursor": ["not a cursor returned by this API"]},
        ) from None


MAX_WAIT_S = 30.0


@dataclass(frozen=True)
class Waiter:
    """What a wait needs besides the session: the bus that says when a job changed,
    and `release`, which ends the session's read and gives its connection back
    before each wait (Database.end_reads), so a waiting request holds none."""

    bus: EventBus
    release: Callable[[], None]


def wait_for_change(
    session: Session, waiter: Waiter, tenant_id: int, job_id: uuid.UUID, wait_s: float
) -> Job:
    """The job, after waiting up to `wait_s` (capped at 30 s) for its next change
    while it is unfinished: a polling client need not spin."""
    if wait_s <= 0:
        return get(session, tenant_id, job_id)
    return _wait(session, waiter, tenant_id, job_id, min(wait_s, MAX_WAIT_S), changes=1)


def wait_until_finished(
    session: Session, waiter: Waiter, tenant_id: int, job_id: uuid.UUID, wait_s: float
) -> Job:
    """The job once it finished, or as it stands after `wait_s`."""
    return _wait(session, waiter, tenant_id, job_id, wait_s, changes=None)


def _wait(
    session: Session,
    waiter: Waiter,
    tenant_id: int,
    job_id: uuid.UUID,
    wait_s: float,
    *,
    changes: int | None,
) -> Job:
    """The job once finished, or after `changes` changes (None: any number), or as
    it stands after `wait_s`. Reads it once per change, and holds no database
    connection while waiting."""
    give_up = time.monotonic() + wait_s
    with waiter.bus.watching(job_id) as watch:
        first = seen = watch.version()  # before each read, so no change is missed
        while True:
            job = session.get(
                Job, job_id, populate_existing=True, options=[undefer(Job.output_data)]
            )
            if job is None or job.tenant_id != tenant_id:
                raise NotFound(f"no job with id {job_id}")
            left = give_up - time.monotonic()
            enough = changes is not None and seen - first >= changes
            if job.status in TERMINAL or left <= 0 or enough:
                return job
            waiter.release()
            seen = watch.wait(seen, left)


_EVENTS_DUE = text(
    """
    SELECT (SELECT max(id) FROM job_events) AS newest,
           (SELECT max(id) FROM job_events WHERE job_id = :id) AS own,
           (SELECT status FROM jobs WHERE id = :id) AS status
    """
)


def events_due(session: Session, job_id: uuid.UUID, after: int) -> bool:
    """Whether a stream resumed after event `after` has anything to send: not
    once the job finished and its terminal event was sent. An `after` past every
    event there is cannot come from this service: a 400, not a stream that waits
    for it."""
    row = session.execute(_EVENTS_DUE, {"id": job_id}).one()
    if after > (row.newest or 0):
        raise MalformedRequest(
            f"Last-Event-ID {after} is past every event this service has sent; send the id "
            "of the last event received, or none to start from the first",
            errors={"Last-Event-ID": ["the id of an event received"]},
        )
    return not (row.status in TERMINAL and after >= (row.own or 0))
