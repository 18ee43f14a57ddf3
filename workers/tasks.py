"""Thin tasks: each takes ids (or nothing) and calls one operation of its worker's
container. Every task is a scope: its session is the container database's
scoped one, closed when the task ends; each operation owns its transactions."""

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

from app.container import Container
from app.observability import logs, metrics
from app.operations.batches import SPLIT_TASK
from app.operations.execution import DRAIN_TASK, PURGE_TASK, SWEEP_TASK
from app.operations.schedules import TICK_TASK
from app.operations.webhooks import DELIVER_TASK
from app.operations.webhooks import SWEEP_TASK as WEBHOOK_SWEEP_TASK
from app.platform.database import database_unavailable
from app.platform.fencing import Fenced
from app.platform.periodic import clear_pending

logger = logging.getLogger(__name__)


def services(task: Task) -> Container:
    """The container of the worker running `task` (see app.platform.broker)."""
    container: Container = task.app.services
    return container


@contextmanager
def _sweeping(task: Task, name: str, fence: int | None) -> Iterator[Container]:
    """Once the sweep is over, beat may send the next (see app.platform.periodic).
    Its units of work are fenced by the lease term `fence` it was sent in (see
    app.platform.fencing): a term that ended stops it before it writes."""
    container = services(task)
    settings = container.settings
    try:
        lease = settings.control_queue
        with container.parts.database.fenced(lease, fence, settings.control_lease_seconds):
            yield container
    except Fenced as exc:
        logger.info("%s not run further: %s (another beat sends the sweeps)", name, exc)
        metrics.SWEEPS_FENCED.labels(name).inc()
    finally:
        clear_pending(settings.redis_url, settings.control_queue, name, fence)
        metrics.SWEEPS.labels(name).inc()  # they log only when they did something


@shared_task(name=DRAIN_TASK, bind=True, max_retries=8)
def drain(self: Task, model: str) -> int:
    """A wake-up for `model`: run its queued jobs (see app.execution.dispatch). It claims
    that model's jobs only. One that came on a queue other than the model's card
    names (a waker that read a stale card, or none) is passed on to that queue,
    not run here: a CPU worker never runs a GPU model's jobs. Passing on counts
    as a retry, so two machines whose cards disagree give up after max_retries."""
    container = services(self)
    execution = container.worker.execution
    came_on = (self.request.delivery_info or {}).get("routing_key")
    logs.bind(model=model)
    try:
        queue = execution.queue_for(model)
        if came_on and came_on != queue and execution.on_disk(model):
            logger.warning("a wake-up for %s came on queue %s: passed on to its card's %s",
                           model, came_on, queue)  # fmt: skip
            execution.taken(model, came_on)
            raise self.retry(queue=queue, countdown=0)
        execution.taken(model, came_on)
        if execution.generates(model):
            return container.worker.generation.drain(model)
        return execution.drain(model)
    except (DBAPIError, RedisError) as exc:
        # The database or Redis went away: take the wake-up again later, with backoff
        # and jitter. Jobs claimed meanwhile come back through their leases.
        if not container.guards.retry:
            raise
        if isinstance(exc, DBAPIError) and not database_unavailable(exc):
            raise
        countdown = random.uniform(0, min(60, 2 ** (self.request.retries + 1)))
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(name=SPLIT_TASK, bind=True, ignore_result=True)
def split_batch(self: Task, batch_id: str) -> str:
    """Cut a file batch into chunk jobs (see app.operations.batches)."""
    return services(self).batches.split(uuid.UUID(batch_id))


@shared_task(name=TICK_TASK, bind=True, ignore_result=True)
def fire_schedules(self: Task, fence: int | None = None) -> dict[str, int]:
    """Beat's tick: fire due schedules, then write finished runs' results."""
    done = {"fired": 0, "written": 0}
    with _sweeping(self, TICK_TASK, fence) as container:
        done["fired"] = len(container.schedules.fire_due(container.batches.start_split))
        done["written"] = container.schedules.export_finished()
    return done


@shared_task(name=SWEEP_TASK, bind=True, ignore_result=True)
def sweep(self: Task, fence: int | None = None) -> dict[str, int]:
    counts: dict[str, int] = {}
    with _sweeping(self, SWEEP_TASK, fence) as container:
        counts = container.worker.maintenance.sweep()  # (the sweep logs what it moved)
        for action, jobs in counts.items():
            if jobs:
                metrics.SWEEP_JOBS.labels(action).inc(jobs)
        counts["batches"] = container.batches.sweep()
        if counts["batches"]:
            logger.info("sweep: %d batch(es) finished or sent to split again", counts["batches"])
    return counts


@shared_task(name=PURGE_TASK, bind=True, ignore_result=True)
def purge(self: Task, fence: int | None = None) -> dict[str, Any]:
    counts: dict[str, Any] = {}
    with _sweeping(self, PURGE_TASK, fence) as container:
        counts = container.worker.maintenance.purge()  # logs its own
        if done := {k: v for k, v in counts.items() if k in _PURGE_OWN and v}:
            logger.info("purge: %s", done)
    return counts


_PURGE_OWN = ("purged", "batch_objects", "idempotency_keys", "previous_webhook_secrets")


@shared_task(name=DELIVER_TASK, bind=True, ignore_result=True)
def deliver_webhook(self: Task, delivery_id: int) -> str | None:
    return services(self).webhooks.deliver(delivery_id)


@shared_task(name=WEBHOOK_SWEEP_TASK, bind=True, ignore_result=True)
def sweep_webhooks(self: Task, fence: int | None = None) -> int:
    """Send due deliveries (and those whose worker died mid-send) to the webhooks queue."""
    ids: list[int] = []
    with _sweeping(self, WEBHOOK_SWEEP_TASK, fence) as container:
        settings = container.settings

        def send(delivery_id: int) -> None:
            container.parts.celery.send_task(
                DELIVER_TASK, args=[delivery_id], queue=settings.webhooks_queue
            )

        ids = container.webhooks.send_due(send)
    if ids:
        logger.info("webhook sweep: %d due delivery(ies) sent to the senders", len(ids))
    return len(ids)
