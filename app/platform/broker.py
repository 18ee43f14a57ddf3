"""The Celery app, configured from `Settings`; every task runs in a unit of work.

Built by the container for every process (the API sends wake-ups with it, the
worker runs tasks with it); the worker's own hooks (logging, fork, metrics)
are in `workers.celery_app`. Broker settings chosen on purpose:
- JSON only: messages carry job ids, never pickled objects or payloads.
- `task_acks_late` + `task_reject_on_worker_lost`: a message is acknowledged
  after the task returns, so a worker that dies mid-job leaves it on the queue.
- prefetch 1: a worker holds one job it is not running, not a batch it could lose.
- a visibility timeout (BROKER_VISIBILITY_TIMEOUT_SECONDS, an hour) far above
  any job's run time, so Redis rarely hands a running job to a second worker;
  when it does, the job's lease makes that second delivery a no-op.
- `worker_cancel_long_running_tasks_on_connection_loss`: a task whose message
  will be redelivered after a broker reconnect is stopped rather than run twice.
- Redis itself must run with `noeviction` and AOF (docker-compose.yml, and the
  embedded server), so queued messages survive memory pressure and restarts.
- no result backend: job state lives in PostgreSQL, never in Celery results.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import redis
from celery import Celery, Task
from kombu.transport import redis as kombu_redis

from app.observability import logs
from app.platform.settings import Settings

logger = logging.getLogger(__name__)


def closed_channels_raise_connection_errors() -> None:
    """Stop a worker from exiting when Redis goes away while it holds messages.

    A kombu 5.7 Redis channel whose connection was let go of (after the broker
    dropped) still builds a client when asked to: to put its unacknowledged messages
    back as it closes, or to acknowledge a task that finished after the loss (a thread
    pool cannot cancel it). Building it reads the connection it no longer has and
    raises AttributeError, which is not one of the connection errors Celery tolerates
    there, so the worker exits ("Unrecoverable error"; the fault suite's Redis kill
    caught the control worker so, and with it the sweeps). Here such a channel raises
    redis' ConnectionError instead, which Celery handles as the lost connection it is:
    the messages stay in Redis's unacked set until `restore_visible` brings them back,
    and jobs live in PostgreSQL anyway."""
    channel = kombu_redis.Channel
    if getattr(channel._connparams, "raises_when_closed", False):
        return
    connparams = channel._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("the channel's broker connection is closed")
        return connparams(self, asynchronous)

    _connparams.raises_when_closed = True  # type: ignore[attr-defined]
    channel._connparams = _connparams  # type: ignore[method-assign]


# A Redis that stops answering without closing the connection (a partition, a
# failover behind a NAT): a publish waited for its reply for ever, and with it the
# API process's job writer, so every later submit there hung. Now a command gives
# up after socket_timeout (a publish, with Celery's three retries, in about 20 s;
# kombu's own check drops a silent BRPOP connection in under a minute), and
# keepalives find a dead peer on an idle connection. (Fewer publish retries made
# the wake-ups during a Redis restart fail and left their jobs to the sweep: the
# fault suite's scenario 4 then recovered in 29 s, not 4.)
# kombu applies the keepalive options to TCP connections only (and only those
# this platform's socket module has: macOS names no TCP_KEEPIDLE).
BROKER_SOCKET_CHECKS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
    "socket_keepalive_options": {
        getattr(socket, name): value
        for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
        if hasattr(socket, name)
    },
}


def make_celery(
    settings: Settings,
    unit_of_work: Callable[[], AbstractContextManager[Any]],
    beat_schedule: dict[str, dict[str, Any]],
    services: object,
) -> Celery:
    """`unit_of_work` wraps every task (its database scope); `services` (the
    process's container) is what tasks reach as `self.app.services`."""
    closed_channels_raise_connection_errors()
    if settings.broker_visibility_timeout_seconds <= settings.job_time_limit_seconds:
        logger.warning(
            "BROKER_VISIBILITY_TIMEOUT_SECONDS (%g) should exceed JOB_TIME_LIMIT_SECONDS (%g): "
            "Redis will hand jobs still running to other workers, whose claims the lease "
            "then refuses",
            settings.broker_visibility_timeout_seconds,
            settings.job_time_limit_seconds,
        )

    class UnitOfWorkTask(Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            # A fresh log context per task: what it binds (model, job) ends with it.
            with logs.scope(), unit_of_work():
                return self.run(*args, **kwargs)

    celery = Celery("app", task_cls=UnitOfWorkTask)
    celery.conf.update(
        broker_url=settings.broker_url,
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.jobs_queue,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_seconds,
            # kombu scans for messages past their visibility timeout every interval
            # times throttle seconds (10 x 10 by default); the setting is the period.
            "unacked_restore_interval": settings.broker_restore_interval_seconds,
            "unacked_restore_throttle": 1,
            **BROKER_SOCKET_CHECKS,
        },
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        task_send_sent_event=False,
        beat_schedule=beat_schedule,
        beat_scheduler="workers.beat:OnePendingScheduler",
        inference_redis_url=settings.redis_url,
        include=["workers.tasks"],
        timezone="UTC",
    )
    celery.services = services
    celery.set_default()
    return celery


def redis_client(url: str) -> redis.Redis:
    """A client for the broker's Redis (`unix://` sockets too)."""
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def broker_unavailable(error: BaseException) -> bool:
    """Redis did not answer (restarting, cut off): the caller may retry shortly, so
    the doors answer 503 / UNAVAILABLE, never an internal error."""
    return isinstance(error, redis.ConnectionError | redis.TimeoutError)
