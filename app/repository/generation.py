"""The repository generation: a counter every change of the model repository bumps
(a version added, loaded, unloaded, rolled or removed), so every API, worker and
stream process on every machine picks the change up within a second.

The change is announced on a Redis channel, and each serving process has one
thread (`GenerationWatch`) subscribed to it that also reads the counter every
CHECK_S, so a lost announcement (Redis restarted, the subscriber reconnecting)
costs at most that long. When the counter moves, the process rescans its
repository (the folder and the shared load states) and reconciles what it
holds: sessions and decode engines of versions no longer serving are closed.
The counter is a hint; the truth stays the folder and `model_states`, which
every process also polls on its own (MODEL_STATE_CACHE_SECONDS) when Redis is away.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import redis

from app.platform.background import LazyThread
from app.repository.registry import ModelRepository

logger = logging.getLogger(__name__)

KEY = "inference:repository:generation"
CHANNEL = "inference:repository:changed"
CHECK_S = 1.0  # the counter is read at least this often, announced or not


def announce(client: redis.Redis) -> int:
    """Bump the generation and tell every process; the new generation."""
    pipe = client.pipeline(transaction=True)
    pipe.incr(KEY)
    pipe.publish(CHANNEL, b"")
    generation, _ = pipe.execute()
    return int(generation)


def current(client: redis.Redis) -> int:
    found: Any = client.get(KEY)
    return int(found or 0)


class GenerationWatch:
    """One per process: follows the generation, and calls `changed` (from its own
    thread) each time it moved, and once on its first look. `tick` is called
    every CHECK_S as well (a rescan of the folder for versions added by hand)."""

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        changed: Callable[[int], None],
        tick: Callable[[], None] | None = None,
        check_s: float = CHECK_S,
    ) -> None:
        self._client, self._changed, self._tick, self.check_s = client, changed, tick, check_s
        self.generation: int | None = None
        self._thread = LazyThread(self._run, "repository-watch")
        self._seen = threading.Condition()
        self._backoff = 0.5
        self._stopped = threading.Event()
        self.running = False  # followed in this process (a serving one)

    def ensure(self) -> None:
        """Start following (again, after a fork)."""
        if not self._stopped.is_set():
            self._thread.ensure()
            self.running = True

    def stop(self) -> None:
        """Follow no more (a container closed: tests, commands), and wait for the
        thread to end, so it opens nothing after its process closed its pools."""
        self._stopped.set()
        if not self.running:
            return
        with suppress(redis.RedisError):  # wakes its wait on the channel (and others')
            self._client().publish(CHANNEL, b"")
        self._thread.join(self.check_s * 3)

    def wait_for(self, generation: int, timeout_s: float) -> bool:
        """Whether this process has reconciled `generation` (or a later one) within
        `timeout_s` (tests, and a command that must see its own change served)."""
        with self._seen:
            return self._seen.wait_for(
                lambda: (self.generation or 0) >= generation, timeout=timeout_s
            )

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._follow()
            except Exception as exc:  # Redis away: the periodic polls still serve
                logger.warning("repository watch lost Redis (%s); again in %.1f s", exc,
                               self._backoff)  # fmt: skip
                self._stopped.wait(self._backoff)
                self._backoff = min(self._backoff * 2, 30.0)

    def _follow(self) -> None:
        client = self._client()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(CHANNEL)
            self._backoff = 0.5
            while not self._stopped.is_set():
                pubsub.get_message(timeout=self.check_s)
                if self._stopped.is_set():
                    return
                self._look(current(client))
                if self._tick is not None:
                    self._tick()
        finally:
            pubsub.close()

    def _look(self, generation: int) -> None:
        if generation == self.generation:
            return
        try:
            self._changed(generation)
        except Exception:  # a listener's fault: looked at again on the next change
            logger.exception("reconciling repository generation %d failed", generation)
        with self._seen:
            self.generation = generation
            self._seen.notify_all()


Retain = Callable[[set[str]], object]


class Reconciler:
    """Keeps what a process holds per model version (sessions, decode engines) in
    step with its repository: each holder's `retain` is called with the refs
    (`name:version`) that serve now, after every rescan that may have changed
    them, from the watch's thread (never on a request's path)."""

    def __init__(self, repository: ModelRepository, client: Callable[[], redis.Redis]) -> None:
        self._repository = repository
        self._holders: list[Retain] = []
        self._revision = -1
        self._lock = threading.Lock()
        self.watch = GenerationWatch(client, self._changed, self._tick)
        self._probe = probe = client()  # (redis-py's pool reconnects after a fork)
        repository.behind = lambda: (
            self.watch.running and current(probe) > (self.watch.generation or 0)
        )

    def hold(self, retain: Retain) -> None:
        """Reconcile `retain`'s holder from now on."""
        with self._lock:
            self._holders.append(retain)

    def follow(self) -> None:
        """Start following the generation in this process (a serving one: the API, a
        worker child, the gRPC door, the stream consumer), again after a fork."""
        self.watch.ensure()

    def announce(self) -> None:
        """Tell every process the repository changed."""
        announce(self._probe)

    def stop(self) -> None:
        self.watch.stop()

    def _changed(self, _generation: int) -> None:
        self._repository.sync(force=True)
        self.reconcile()

    def _tick(self) -> None:
        self._repository.sync()
        if self._repository.revision != self._revision:
            self.reconcile()

    def reconcile(self) -> None:
        """Hand every holder the refs that serve now."""
        with self._lock:
            self._revision = self._repository.revision
            serving = {card.ref for card in self._repository.all()}
            holders = list(self._holders)
        for retain in holders:
            try:
                retain(serving)
            except Exception:  # one holder's fault: the others are still reconciled
                logger.exception("could not reconcile a holder of model versions")
