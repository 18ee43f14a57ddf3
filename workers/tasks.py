"""Thin tasks: each takes ids (or nothing) and calls the job layer. No app import here."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task, shared_task
from flask import current_app
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

from app.batches import service as batches
from app.jobs import dispatch, runner, sweeps
from app.jobs import periodic as control
from app.jobs.runtime import current_runtime
from app.observability import logs, metrics
from app.platform.database import current_session, database_unavailable
from app.platform.settings import Settings
from app.schedules import service as schedules
from app.webhooks import delivery

logger = logging.getLogger(__name__)


@contextmanager
def _sweeping(task: str) -> Iterator[Settings]:
    """Once the sweep is over, beat may send the next (see app.jobs.periodic)."""
    settings: Settings = current_app.extensions["settings"]
    try:
        yield settings
    finally:
        control.clear_pending(settings.redis_url, settings.control_queue, task)
        metrics.SWEEPS.labels(task).inc()  # they log only when they did something


@shared_task(name=dispatch.DRAIN_TASK, bind=True, max_retries=8)
def drain(self: Task, model: str) -> int:
    """A wake-up for `model`: run its queued jobs (see app.jobs.dispatch). It claims
    that model's jobs only. One that came on a queue other than the model's card
    names (a waker that read a stale card, or none) is passed on to that queue,
    not run here: a CPU worker never runs a GPU model's jobs. Passing on counts
    as a retry, so two machines whose cards disagree give up after max_retries."""
    dispatcher = dispatch.current()
    came_on = (self.request.delivery_info or {}).get("routing_key")
    logs.bind(model=model)
    try:
        queue = dispatcher.queue_for(model)
        if came_on and came_on != queue and current_runtime().repository.on_disk(model):
            logger.warning("a wake-up for %s came on queue %s: passed on to its card's %s",
                           model, came_on, queue)  # fmt: skip
            dispatcher.taken(model, came_on)
            raise self.retry(queue=queue, countdown=0)
        dispatcher.taken(model, came_on)
        return runner.drain(
            current_session(), current_runtime(), model, lambda: dispatcher.wake(model)
        )
    except (DBAPIError, RedisError) as exc:
        # The database or Redis went away: take the wake-up again later, with backoff
        # and jitter. Jobs claimed meanwhile come back through their leases.
        if "retry" in current_app.extensions["settings"].guards_off:
            raise
        if isinstance(exc, DBAPIError) and not database_unavailable(exc):
            raise
        countdown = random.uniform(0, min(60, 2 ** (self.request.retries + 1)))
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(name=batches.SPLIT_TASK, ignore_result=True)
def split_batch(batch_id: str) -> str:
    """Cut a file batch into chunk jobs (see app.batches.service.split)."""
    dispatcher = dispatch.current()
    return batches.split(
        current_session(), current_runtime().repository, uuid.UUID(batch_id), dispatcher.wake
    )


@shared_task(name=schedules.TICK_TASK, ignore_result=True)
def fire_schedules() -> dict[str, int]:
    """Beat's tick: fire due schedules, then write finished runs' results."""
    with _sweeping(schedules.TICK_TASK) as settings:
        session, runtime = current_session(), current_runtime()
        fired = schedules.fire_due(session, runtime.repository, settings, batches.start_split)
        written = schedules.export_finished(
            session, runtime.repository, settings, current_app.extensions["database"].sessionmaker
        )
    return {"fired": len(fired), "written": written}


@shared_task(name=dispatch.SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    with _sweeping(dispatch.SWEEP_TASK) as settings:
        counts = sweeps.sweep(current_session(), settings)  # logs what it moved
        for action, jobs in counts.items():
            if jobs:
                metrics.SWEEP_JOBS.labels(action).inc(jobs)
        counts["batches"] = batches.sweep(current_session(), settings, batches.start_split)
    if counts["batches"]:
        logger.info("sweep: %d batch(es) finished or sent to split again", counts["batches"])
    return counts


@shared_task(name=dispatch.PURGE_TASK, ignore_result=True)
def purge() -> dict[str, Any]:
    with _sweeping(dispatch.PURGE_TASK) as settings:
        counts = sweeps.purge(current_session(), settings)  # retention logs its own
    if done := {k: v for k, v in counts.items() if k in _PURGE_OWN and v}:
        logger.info("purge: %s", done)
    return counts


_PURGE_OWN = ("purged", "idempotency_keys", "previous_webhook_secrets")


@shared_task(name=delivery.DELIVER_TASK, ignore_result=True)
def deliver_webhook(delivery_id: int) -> str | None:
    return delivery.deliver(current_session(), current_app.extensions["settings"], delivery_id)


@shared_task(name=delivery.SWEEP_TASK, ignore_result=True)
def sweep_webhooks() -> int:
    """Send due deliveries (and those whose worker died mid-send) to the webhooks queue."""
    with _sweeping(delivery.SWEEP_TASK) as settings:
        ids = delivery.take_due(current_session(), settings)
        celery = current_app.extensions["celery"]
        for delivery_id in ids:
            celery.send_task(
                delivery.DELIVER_TASK, args=[delivery_id], queue=settings.webhooks_queue
            )
    if ids:
        logger.info("webhook sweep: %d due delivery(ies) sent to the senders", len(ids))
    return len(ids)
