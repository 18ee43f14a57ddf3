"""Which Celery workers are online, and the queues each consumes.

Asked with a control broadcast (`inspect().active_queues()`, answered by every
worker's own control thread) rather than by following worker heartbeats: a
heartbeat listener in every API process would receive every task event of every
worker (what Flower pays for, about 1 ms of CPU a job) just to keep a list that
a page needs now and then. The broadcast waits `timeout_s` (1 s) for answers, so
its answer is kept `ttl_s` per process: however often the page is loaded, each
API process asks the broker at most once per period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from kombu.exceptions import KombuError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Census:
    """Workers that answered, by hostname, with their queues; `reachable` False
    when the broker itself did not answer (nothing is known of the workers).
    `queues`: the service's own queues (jobs, webhooks, control), which the page
    counts workers for."""

    reachable: bool
    queues: tuple[str, ...]
    workers: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def serving(self, queue: str) -> int:
        return sum(queue in queues for queues in self.workers.values())

    @property
    def online(self) -> int:
        """Workers serving at least one of the service's queues (a broker may be
        shared with other services, whose workers answer too)."""
        return sum(bool(set(queues) & set(self.queues)) for queues in self.workers.values())


class WorkerCensus:
    def __init__(
        self,
        celery: Any,
        redis_url: str,
        queues: tuple[str, ...],
        ttl_s: float,
        timeout_s: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.celery, self.redis_url, self.queues = celery, redis_url, queues
        self.ttl_s, self.timeout_s, self.clock = ttl_s, timeout_s, clock
        self._lock = threading.Lock()
        self._census: Census | None = None
        self._at = 0.0

    def current(self) -> Census:
        """The census at most `ttl_s` old (by `clock`); one thread asks, the others
        wait for it."""
        with self._lock:
            if self._census is None or self.clock() - self._at >= self.ttl_s:
                self._census = self._ask()
                self._at = self.clock()
            return self._census

    def _ask(self) -> Census:
        # A quick ping first: with the broker down, kombu's broadcast would wait on
        # its own connection retries rather than answer within the timeout.
        try:
            client = redis.Redis.from_url(
                self.redis_url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
            )
            client.ping()
            client.close()
            replies = self.celery.control.inspect(timeout=self.timeout_s).active_queues() or {}
        except (redis.RedisError, OSError, KombuError) as exc:
            logger.warning("status: the broker did not answer (%s)", type(exc).__name__)
            return Census(False, self.queues)
        return Census(
            True,
            self.queues,
            {
                host: tuple(sorted(q["name"] for q in queues or ()))
                for host, queues in sorted(replies.items())
            },
        )
