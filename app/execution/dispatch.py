"""Waking workers for a model's queued jobs. PostgreSQL holds every queued job;
a Celery message is only a wake-up for one model, never a copy of a job.

At most one wake-up per model is pending: a Redis key marks it, set with NX by
whoever publishes and deleted by the worker that takes it *before* it claims.
So a job committed while a wake-up is pending is found by that wake-up's
claims, and a job committed after the key was deleted publishes a new one:
under load, one message covers every job that arrived while workers were busy.
The key expires (WAKE_FLAG_TTL_S), and the sweep wakes models whose jobs wait
too long regardless of it, so a lost message delays jobs but loses none. A waker
that dies between setting the key and publishing (a process killed, a host lost)
leaves the key without a message: a key older than WAKE_AGAIN_AFTER_S is taken
over by the next waker, who publishes again, so such a death holds the model's
next jobs back for seconds, not for the key's life. (Workers busy past that age
get one more wake-up for the model every WAKE_AGAIN_AFTER_S: one claim that
finds little, at most.)

Each model's wake-ups travel on the queue its card names (`"queue": "gpu"`), or
DEFAULT_MODEL_QUEUE: only workers subscribed to it (WORKER_QUEUES) run the
model. The queue is looked up from the model's name alone, in the model
repository every API and worker process holds, so every waker (submit, sync,
batches, the sweep, a drain handing over) sends to the same place, and the
pending flag is kept per queue and model.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import Callable

import redis
from celery import Celery

from app.platform.broker import redis_client

logger = logging.getLogger(__name__)

DRAIN_TASK = "jobs.drain"
SWEEP_TASK = "jobs.sweep"
PURGE_TASK = "jobs.purge"

WAKE_FLAG_TTL_S = 30
WAKE_AGAIN_AFTER_S = 2.0
# Set the flag, or take it over when older than ARGV[2] ms or when forced (ARGV[3]):
# 1 means publish. Its age is its life less its time to live (no clocks compared).
_WAKE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 1 end
local left = redis.call('PTTL', KEYS[1])
if ARGV[3] == '1' or (left >= 0 and tonumber(ARGV[1]) - left >= tonumber(ARGV[2])) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return 1
end
return 0
"""
_WAKE_MS = (WAKE_FLAG_TTL_S * 1000, int(WAKE_AGAIN_AFTER_S * 1000))  # (the script's ARGV 1, 2)
_BACKLOG_LOOKED = 8  # messages read of each queue (a model has one wake-up pending, mostly)


class Dispatcher:
    def __init__(
        self,
        celery: Celery,
        redis_url: str,
        queue: str,
        route: Callable[[str], str | None] | None = None,
    ) -> None:
        """`queue`: for tasks that name no model, and for models `route` gives none
        (no `route`: every model)."""
        self._celery = celery
        self._redis = redis_client(redis_url)
        self._queue = queue
        self._route = route
        self._wake = self._redis.register_script(_WAKE)

    def queue_for(self, model: str) -> str:
        """The queue `model`'s wake-ups travel on."""
        return (self._route(model) if self._route else None) or self._queue

    def _flag(self, queue: str, model: str) -> str:
        return f"inference:wake:{queue}:{model}"

    def wake(self, model: str, *, force: bool = False) -> bool:
        """Make sure a wake-up for `model` is pending; `force` publishes one even
        if the flag says one is, and so does a flag older than WAKE_AGAIN_AFTER_S.
        Returns False when Redis refused: the caller leaves its jobs for the
        sweep, so an outage delays work but loses none."""
        queue = self.queue_for(model)
        flag = self._flag(queue, model)
        try:
            if not self._wake(keys=[flag], args=[*_WAKE_MS, int(force)]):
                return True
            self._celery.send_task(DRAIN_TASK, args=[model], queue=queue)
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

    def pending(self, model: str) -> bool:
        """Whether jobs of `model` were committed since a running loop last claimed: a
        wake-up is pending, or a worker that took one found the loop running and
        passed it on (`pass_to_loop`). A running loop's cheap look for new work
        (app.engine.core)."""
        queue = self.queue_for(model)
        return bool(self._redis.exists(self._flag(queue, model), self._for_loop(queue, model)))

    def backlog(self, model: str) -> bool:
        """Whether a message other than `model`'s own wake-ups waits on the broker,
        on the model's queue or another this worker process consumes: a worker
        with a free process would have taken it, so an idle decode loop lingering
        here should give its process back. (Its own wake-ups it serves: the flag
        brings their jobs to it. Redis away: none seen; its other calls will tell.)"""
        selected = self._celery.amqp.queues.consume_from or {}
        queues = sorted({self.queue_for(model), *selected})
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.lrange(queue, 0, _BACKLOG_LOOKED - 1)  # (kombu's list of messages)
                waiting = pipe.execute()
        except redis.RedisError:
            return False
        return any(not _wakes(raw, model) for messages in waiting for raw in messages)

    def pass_to_loop(self, model: str) -> None:
        """A worker took a wake-up but the machine's loop for the model is running:
        tell the loop (its own key; the wake-up flag itself means a task is on its
        way, and set without one it would hold back the next wake-up)."""
        queue = self.queue_for(model)
        self._redis.set(self._for_loop(queue, model), "1", ex=WAKE_FLAG_TTL_S)

    def taken(self, model: str, queue: str | None = None) -> None:
        """A worker took the wake-up (from `queue`, default: the model's): jobs
        committed from now on need a new one."""
        queue = queue or self.queue_for(model)
        self._redis.delete(self._flag(queue, model), self._for_loop(queue, model))

    @staticmethod
    def _for_loop(queue: str, model: str) -> str:
        return f"inference:wake-loop:{queue}:{model}"

    def _forget(self, flag: str) -> None:
        with contextlib.suppress(redis.RedisError):  # else it expires by itself
            self._redis.delete(flag)


def _wakes(raw: bytes, model: str) -> bool:
    """Whether a message on kombu's Redis list is a wake-up for `model`."""
    try:
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        return bool(message["headers"]["task"] == DRAIN_TASK and args == [model])
    except (ValueError, KeyError, TypeError, IndexError):
        return False
