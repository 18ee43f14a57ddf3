"""Waking workers for a model's queued jobs. PostgreSQL holds every queued job;
a Celery message is only a wake-up for one model, never a copy of a job.

At most one wake-up per model is pending: a Redis key marks it, set with NX by
whoever publishes and deleted by the worker that takes it *before* it claims.
So a job committed while a wake-up is pending is found by that wake-up's
claims, and a job committed after the key was deleted publishes a new one:
under load, one message covers every job that arrived while workers were busy.
The key expires (WAKE_FLAG_TTL_S), and the sweep wakes models whose jobs wait
too long regardless of it, so a lost message delays jobs but loses none.
"""

from __future__ import annotations

import contextlib
import logging

import redis
from celery import Celery
from flask import current_app

logger = logging.getLogger(__name__)

DRAIN_TASK = "jobs.drain"
SWEEP_TASK = "jobs.sweep"
PURGE_TASK = "jobs.purge"

WAKE_FLAG_TTL_S = 30


def redis_client(url: str) -> redis.Redis:
    """A client for the broker's Redis (`unix://` sockets too)."""
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


class Dispatcher:
    def __init__(self, celery: Celery, redis_url: str, queue: str) -> None:
        self._celery = celery
        self._redis = redis_client(redis_url)
        self._queue = queue

    def _flag(self, model: str) -> str:
        return f"inference:wake:{self._queue}:{model}"

    def wake(self, model: str, *, force: bool = False) -> bool:
        """Make sure a wake-up for `model` is pending; `force` publishes one even
        if the flag says one is. Returns False when Redis refused: the caller
        leaves its jobs for the sweep, so an outage delays work but loses none."""
        flag = self._flag(model)
        try:
            if not self._redis.set(flag, "1", nx=True, ex=WAKE_FLAG_TTL_S) and not force:
                return True
            self._celery.send_task(DRAIN_TASK, args=[model], queue=self._queue)
        except Exception as exc:  # redis-py and kombu raise many kinds; all mean "not sent"
            logger.warning("could not wake workers for %s: %s", model, exc)
            self._forget(flag)
            return False
        return True

    def send(self, task: str, *args: str) -> bool:
        """Publish a task on the jobs queue; False when the broker refused (the
        caller leaves the work for a sweep)."""
        try:
            self._celery.send_task(task, args=list(args), queue=self._queue)
        except Exception as exc:  # kombu and redis-py raise many kinds; all mean "not sent"
            logger.warning("could not send %s: %s", task, exc)
            return False
        return True

    def taken(self, model: str) -> None:
        """A worker took the wake-up: jobs committed from now on need a new one."""
        self._redis.delete(self._flag(model))

    def _forget(self, flag: str) -> None:
        with contextlib.suppress(redis.RedisError):  # else it expires by itself
            self._redis.delete(flag)


def current() -> Dispatcher:
    dispatcher: Dispatcher = current_app.extensions["dispatch"]
    return dispatcher
