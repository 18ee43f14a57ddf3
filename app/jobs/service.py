"""Jobs for a tenant: the pieces the data plane composes (checks, the row, reads,
waits). Nothing here commits, except a wait between its reads (it holds no
connection while it waits); the data plane's operation owns the transaction."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import select, text, tuple_
from sqlalchemy.orm import Session, defer, undefer

from app.cards import ModelCard
from app.errors import InputsDoNotFit, InvalidRequest, MalformedRequest, NotFound
from app.jobs.events import EventBus
from app.jobs.inserts import INSERT_JOB, INSERT_JOBS
from app.jobs.tables import SYNC_PRIORITY, TERMINAL_STATUSES, Job
from app.platform.orm import owned
from app.platform.settings import Settings
from app.runtime.tensors import InvalidInputs, pack, parse_inputs
from app.webhooks.ssrf import UnsafeUrl, check_url, networks


def stage(session: Session, values: dict[str, Any]) -> Job:
    """Insert the job row in the session's transaction; the caller commits.

    A Core INSERT: the ORM's unit of work cost a third of a submit."""
    defaults = session.connection().execute(INSERT_JOB, values).one()._asdict()
    return Job(**values, **defaults)


def stage_many(session: Session, values: list[dict[str, Any]]) -> list[Job]:
    """Insert many job rows in one statement in the session's transaction, in the
    order given; the caller commits."""
    rows = session.connection().execute(INSERT_JOBS, values).all()
    defaults = {row.id: row._asdict() for row in rows}
    return [Job(**v, **{k: x for k, x in defaults[v["id"]].items() if k != "id"}) for v in values]


def job_values(
    card: ModelCard,
    arrays: dict[str, np.ndarray],
    tenant_id: int,
    *,
    priority: int,
    deadline: datetime | None,
    webhook: Webhook | None,
    max_attempts: int,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """A new queued job's columns. A card may set its own `max_attempts`;
    `reply_to`: a sync call's reply channel (app.jobs.replies)."""
    return {
        "id": uuid.uuid4(),
        "tenant_id": tenant_id,
        "model": card.name,
        "model_version": card.version,
        "status": "queued",
        "input_data": pack(arrays),
        "batch_rows": batch_rows(card, arrays),
        "priority": priority,
        "attempts": 0,
        "max_attempts": int(card.extra.get("max_attempts", max_attempts)),
        "deadline_at": deadline,
        "webhook_url": webhook.url if webhook else None,
        "webhook_events": list(webhook.events) if webhook else None,
        "reply_to": reply_to,
    }


def record_values(
    card: ModelCard,
    arrays: dict[str, np.ndarray],
    tenant_id: int,
    started_at: datetime,
    compute_seconds: float,
    *,
    outputs: dict[str, np.ndarray] | None = None,
    error: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The record of a sync call that ran inline: a finished job, written once.
    Cheaper than a job: no inputs kept (nothing will run it again), one INSERT."""
    return {
        "id": uuid.uuid4(),
        "tenant_id": tenant_id,
        "model": card.name,
        "model_version": card.version,
        "status": "succeeded" if error is None else "failed",
        "output_data": pack(outputs) if outputs is not None else None,
        "error_code": error[0] if error else None,
        "error_message": error[1] if error else None,
        "batch_rows": batch_rows(card, arrays),
        "priority": SYNC_PRIORITY,
        "attempts": 1,
        "max_attempts": 1,
        "batch_share": 1.0,
        "compute_seconds": compute_seconds,
        "started_at": started_at,
        "finished_at": datetime.now(UTC),
        "enqueued_at": None,
    }


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a job's events are POSTed, and which (`job.succeeded`, ...)."""

    url: str
    events: tuple[str, ...]


def check_webhook(webhook: Webhook, settings: Settings) -> None:
    """InvalidRequest for a URL the service must not call (see app.webhooks.ssrf)."""
    try:
        check_url(
            webhook.url,
            allow_private=settings.webhook_allow_private_networks,
            allowed=networks(settings.webhook_allowed_networks),
        )
    except UnsafeUrl as exc:
        raise InvalidRequest(str(exc), errors={"webhook": {"url": [str(exc)]}}) from None


def check_inputs(card: ModelCard, inputs: Any) -> dict[str, np.ndarray]:
    """The inputs as arrays of the card's datatypes; InputsDoNotFit names each misfit."""
    try:
        return parse_inputs(card, inputs)
    except InvalidInputs as exc:
        raise InputsDoNotFit(
            f"inputs do not match model {card.ref}: {exc}",
            errors=exc.errors,
            expected=[spec.to_dict() for spec in card.inputs],
        ) from None


def batch_rows(card: ModelCard, arrays: dict[str, Any]) -> int:
    """How many rows the job adds to a micro-batch of its model."""
    if card.batching.max_batch_size <= 0:
        return 1
    return max(1, int(next(iter(arrays.values())).shape[0]))


def fingerprint(model: str, version: str | None, inputs: Any) -> str:
    """What makes two requests the same: the model as asked for, and the inputs.
    (Not the deadline: Cancel-After gives every retry a new one.)"""
    canonical = json.dumps([model, version, inputs], sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


MAX_WAIT_S = 30.0


def wait_for_change(
    session: Session, bus: EventBus, tenant_id: int, job_id: uuid.UUID, wait_s: float
) -> Job:
    """The job, after waiting up to `wait_s` (capped at 30 s) for its next change
    while it is unfinished: a polling client need not spin."""
    if wait_s <= 0:
        return get(session, tenant_id, job_id)
    return _wait(session, bus, tenant_id, job_id, min(wait_s, MAX_WAIT_S), changes=1)


def wait_until_finished(
    session: Session, bus: EventBus, tenant_id: int, job_id: uuid.UUID, wait_s: float
) -> Job:
    """The job once it finished, or as it stands after `wait_s`."""
    return _wait(session, bus, tenant_id, job_id, wait_s, changes=None)


def _wait(
    session: Session,
    bus: EventBus,
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
    with bus.watching(job_id) as watch:
        first = seen = watch.version()  # before each read, so no change is missed
        while True:
            job = session.get(
                Job, job_id, populate_existing=True, options=[undefer(Job.output_data)]
            )
            session.commit()
            if job is None or job.tenant_id != tenant_id:
                raise NotFound(f"no job with id {job_id}")
            left = give_up - time.monotonic()
            enough = changes is not None and seen - first >= changes
            if job.status in TERMINAL_STATUSES or left <= 0 or enough:
                return job
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
    return not (row.status in TERMINAL_STATUSES and after >= (row.own or 0))


def deadline(absolute: datetime | None, cancel_after_s: float | None) -> datetime | None:
    """The earlier of a `deadline` and `Cancel-After` seconds from now."""
    now = datetime.now(UTC)
    candidates = [absolute] if absolute else []
    if cancel_after_s:
        candidates.append(now + timedelta(seconds=cancel_after_s))
    earliest = min(candidates, default=None)
    if earliest is not None and earliest <= now:
        raise InvalidRequest(
            f"deadline {earliest.isoformat()} has already passed; send a future time",
            errors={"deadline": ["must be in the future"]},
        )
    return earliest


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
