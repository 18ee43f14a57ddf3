"""Thin tasks: each takes ids (or nothing) and calls the job layer with the
services of its worker's container. Every task is a unit of work: its session
is the container database's scoped one, closed when the task ends."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task, shared_task
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

from app.batches import service as batches
from app.container import Container
from app.dataplane import payloads
from app.jobs import dispatch, periodic, runner, sweeps
from app.observability import logs, metrics
from app.platform.database import database_unavailable
from app.schedules import service as schedules
from app.webhooks import delivery

logger = logging.getLogger(__name__)


def services(task: Task) -> Container:
    """The container of the worker running `task` (see app.platform.broker)."""
    container: Container = task.app.services
    return container


@contextmanager
def _sweeping(task: Task, name: str) -> Iterator[Container]:
    """Once the sweep is over, beat may send the next (see app.jobs.periodic)."""
    container = services(task)
    settings = container.settings
    try:
        yield container
    finally:
        periodic.clear_pending(settings.redis_url, settings.control_queue, name)
        metrics.SWEEPS.labels(name).inc()  # they log only when they did something


@shared_task(name=dispatch.DRAIN_TASK, bind=True, max_retries=8)
def drain(self: Task, model: str) -> int:
    """A wake-up for `model`: run its queued jobs (see app.jobs.dispatch). It claims
    that model's jobs only. One that came on a queue other than the model's card
    names (a waker that read a stale card, or none) is passed on to that queue,
    not run here: a CPU worker never runs a GPU model's jobs. Passing on counts
    as a retry, so two machines whose cards disagree give up after max_retries."""
    container = services(self)
    dispatcher, runtime = container.dispatcher, container.runtime
    came_on = (self.request.delivery_info or {}).get("routing_key")
    logs.bind(model=model)
    try:
        queue = dispatcher.queue_for(model)
        if came_on and came_on != queue and runtime.repository.on_disk(model):
            logger.warning("a wake-up for %s came on queue %s: passed on to its card's %s",
                           model, came_on, queue)  # fmt: skip
            dispatcher.taken(model, came_on)
            raise self.retry(queue=queue, countdown=0)
        dispatcher.taken(model, came_on)
        return runner.drain(
            container.database.session(), runtime, model, lambda: dispatcher.wake(model)
        )
    except (DBAPIError, RedisError) as exc:
        # The database or Redis went away: take the wake-up again later, with backoff
        # and jitter. Jobs claimed meanwhile come back through their leases.
        if not container.guards.retry:
            raise
        if isinstance(exc, DBAPIError) and not database_unavailable(exc):
            raise
        countdown = random.uniform(0, min(60, 2 ** (self.request.retries + 1)))
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(name=batches.SPLIT_TASK, bind=True, ignore_result=True)
def split_batch(self: Task, batch_id: str) -> str:
    """Cut a file batch into chunk jobs (see app.batches.service.split)."""
    container = services(self)
    return batches.split(
        container.database.session(), container.store, container.models, uuid.UUID(batch_id),
        container.dispatcher.wake,
    )  # fmt: skip


@shared_task(name=schedules.TICK_TASK, bind=True, ignore_result=True)
def fire_schedules(self: Task) -> dict[str, int]:
    """Beat's tick: fire due schedules, then write finished runs' results."""
    with _sweeping(self, schedules.TICK_TASK) as container:
        session, settings, models = (
            container.database.session(),
            container.settings,
            container.models,
        )
        fired = schedules.fire_due(
            session, container.store, models, settings, container.dataplane.start_split
        )
        written = schedules.export_finished(
            session, container.store, models, settings, container.database.sessionmaker
        )
    return {"fired": len(fired), "written": written}


@shared_task(name=dispatch.SWEEP_TASK, bind=True, ignore_result=True)
def sweep(self: Task) -> dict[str, int]:
    with _sweeping(self, dispatch.SWEEP_TASK) as container:
        session, settings = container.database.session(), container.settings
        # (the sweep logs what it moved)
        counts = sweeps.sweep(session, settings, container.dispatcher, container.guards)
        for action, jobs in counts.items():
            if jobs:
                metrics.SWEEP_JOBS.labels(action).inc(jobs)
        counts["batches"] = batches.sweep(session, settings, container.dataplane.start_split)
    if counts["batches"]:
        logger.info("sweep: %d batch(es) finished or sent to split again", counts["batches"])
    return counts


@shared_task(name=dispatch.PURGE_TASK, bind=True, ignore_result=True)
def purge(self: Task) -> dict[str, Any]:
    with _sweeping(self, dispatch.PURGE_TASK) as container:
        counts = sweeps.purge(  # logs its own
            container.database.session(), container.settings, container.store
        )
    if done := {k: v for k, v in counts.items() if k in _PURGE_OWN and v}:
        logger.info("purge: %s", done)
    return counts


_PURGE_OWN = ("purged", "batch_objects", "idempotency_keys", "previous_webhook_secrets")


@shared_task(name=delivery.DELIVER_TASK, bind=True, ignore_result=True)
def deliver_webhook(self: Task, delivery_id: int) -> str | None:
    container = services(self)
    session, settings = container.database.session(), container.settings
    return delivery.deliver(session, settings, delivery_id, payloads.render)


@shared_task(name=delivery.SWEEP_TASK, bind=True, ignore_result=True)
def sweep_webhooks(self: Task) -> int:
    """Send due deliveries (and those whose worker died mid-send) to the webhooks queue."""
    with _sweeping(self, delivery.SWEEP_TASK) as container:
        settings = container.settings
        ids = delivery.take_due(container.database.session(), settings)
        for delivery_id in ids:
            container.celery.send_task(
                delivery.DELIVER_TASK, args=[delivery_id], queue=settings.webhooks_queue
            )
    if ids:
        logger.info("webhook sweep: %d due delivery(ies) sent to the senders", len(ids))
    return len(ids)
