"""Lease renewal for the jobs a process runs: one thread per process for all of them.

A job's lease is renewed every third of its length while it runs, so only a
worker that died loses it; a job that outruns its time limit is handed to the
process's `on_limit` (worker children kill themselves there); one whose renewal
finds it no longer this worker's (its lease ran out while the worker was cut off,
and the job went to another attempt) to `on_lost`, where given. Short jobs end
before their first renewal and cost no write. One long-lived thread (started
after a fork, on first use) replaces a thread started and joined per micro-batch,
which had cost a one-row job more wall time than running it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from app.jobs.claims import ClaimedJob
from app.platform.background import LazyThread

logger = logging.getLogger(__name__)

OnLimit = Callable[[list[ClaimedJob]], None]
# Renews the jobs' leases; returns the ids still this worker's (None: not known).
Renew = Callable[[list[ClaimedJob]], set[uuid.UUID] | None]


@dataclass
class _Held:
    jobs: list[ClaimedJob]
    started: float
    renewed: float
    interval_s: float
    limit_s: float
    on_limit: OnLimit | None
    on_lost: OnLimit | None = None
    limited: bool = False  # its limit was reached: `on_limit` called, renewals over


class LeaseKeeper:
    """Holds the process's running micro-batches; `renew` writes new leases for
    a list of jobs (its own session and commit)."""

    def __init__(self, renew: Renew) -> None:
        self._renew = renew
        self._held: dict[int, _Held] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._idle_s = 1.0  # the shortest interval or limit held yet: the thread's longest sleep
        self._thread = LazyThread(self._run, "lease-renewal")

    @contextmanager
    def holding(
        self,
        jobs: list[ClaimedJob],
        interval_s: float,
        limit_s: float,
        on_limit: OnLimit | None,
        on_lost: OnLimit | None = None,
    ) -> Iterator[None]:
        """Renew these jobs' leases every `interval_s` until the block ends; after
        `limit_s`, call `on_limit` once (where given) and renew no more. A job a
        renewal finds lost goes to `on_lost` (where given), once, and is renewed no more."""
        now = time.monotonic()
        held = _Held(list(jobs), now, now, interval_s, limit_s, on_limit, on_lost)
        key = next(self._keys)
        with self._lock:
            self._held[key] = held
            self._idle_s = min(self._idle_s, interval_s, limit_s)
        self._thread.ensure()
        try:
            yield
        finally:
            with self._lock:
                del self._held[key]

    def _run(self) -> None:
        # The thread sleeps at most one interval (or limit) at a time, so a batch
        # held meanwhile is looked at no later than its first due time: no wake-up
        # is needed when one is added.
        while True:
            time.sleep(self._tick(time.monotonic()))

    def _tick(self, now: float) -> float:
        """Renew or limit what is due at `now`; how long until something is."""
        with self._lock:
            held, next_due = list(self._held.values()), self._idle_s
        for h in held:
            if h.limited:
                continue  # past its limit: renewed no more, so a holder that never ends
                # it (a loop gone) lets its lease run out for the sweep to take back
            if h.on_limit is not None and now - h.started >= h.limit_s:
                on_limit, h.on_limit, h.limited = h.on_limit, None, True
                logger.error(
                    "job(s) %s exceeded the time limit of %gs", [str(j.id) for j in h.jobs],
                    h.limit_s,
                )  # fmt: skip
                on_limit(h.jobs)
                continue
            if now - h.renewed >= h.interval_s:
                h.renewed = now
                try:
                    owned = self._renew(h.jobs)
                except Exception:  # the next interval tries again; the lease is the backstop
                    logger.exception("could not renew leases")
                else:
                    self._lost(h, owned)
            due = h.renewed + h.interval_s
            if h.on_limit is not None:
                due = min(due, h.started + h.limit_s)
            next_due = min(next_due, due - now)
        return max(0.01, next_due)

    @staticmethod
    def _lost(held: _Held, owned: set[uuid.UUID] | None) -> None:
        if held.on_lost is None or owned is None:
            return
        lost = [j for j in held.jobs if j.id not in owned]
        if lost:
            held.jobs = [j for j in held.jobs if j.id in owned]
            held.on_lost(lost)
