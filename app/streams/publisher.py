"""Results to the output logs, each exactly once, through the outbox.

`stream_entries` is the outbox: an entry whose job ended and whose
`published_at` is NULL has a result to append. The publisher takes such entries
(locked, so two publishers never hold the same ones), appends one output entry
each, in one pipelined round trip per log, then marks them published in the same
transaction. A publisher that dies after appending and before that commit would
append them again: each append is a small Redis script that sets a mark for the
job (NX, kept STREAMS_DEDUPE_SECONDS) and appends only if it set it, atomically,
so the second try appends nothing. Once the commit is done the marks are
deleted: no publisher can take those entries again (the row locks, then
`published_at`, keep them out of every later select, EvalPlanQual rechecking it
under a lock), so only the marks of a crash stay in Redis, for their lifetime.

When to look: every POLL_S while this process has accepted jobs whose results
are not out yet, at the oldest PROBE of them (index probes by job id); nothing
while it has none. Measured against waking on PostgreSQL's `job_events` NOTIFY
(which names every changed job of the service) with bench/stream.py's (j), 3,000
one-row entries, three runs each on 2 busy cores: the NOTIFY wake cost 1.16-1.49
ms of CPU per job over all processes (1.02-1.45 when it gathered 50 ms after a
wake) and the poll 0.89-1.32: a NOTIFY comes for every claim and every finish of
a micro-batch, so it published in smaller pieces, and an idle consumer still paid
for every job of the other doors (0.08 ms each). A sweep of every unpublished
entry runs at start (results that finished while no consumer ran) and every
SWEEP_S (entries another consumer accepted and then died with, or that left the
probe after MAX_FOLLOW_S).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from app.observability import metrics
from app.operations.bindings import BindingOperations, Finished
from app.operations.execution import Guards
from app.platform.logstreams import LogEngine
from app.streams import codec, unstaged

logger = logging.getLogger(__name__)

POLL_S = 0.05
PROBE = 1024  # outstanding jobs looked at per poll, oldest first
SWEEP_S = 2.0
MAX_FOLLOW_S = 600.0  # longer than this, a job is left to the sweep
LIMIT = 512
DEDUPE_KEY = "inference:stream-sent:{job_id}"


class Publisher:
    """One per consumer process, on its own thread."""

    def __init__(
        self,
        operations: BindingOperations,
        scope: Callable[[], AbstractContextManager[object]],
        logs: LogEngine,
        guards: Guards,
        keep_s: float,
        *,
        checkpoint: Callable[[str], None] = unstaged,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.operations, self.scope, self.logs = operations, scope, logs
        self.guards, self.keep_s, self.checkpoint, self.clock = guards, keep_s, checkpoint, clock
        self._lock = threading.Lock()
        # Jobs this process accepted whose results are not out, oldest first.
        self._outstanding: dict[uuid.UUID, float] = {}
        self._wake = threading.Event()

    def accepted(self, job_ids: Iterable[uuid.UUID]) -> None:
        """Jobs the consumer just made: followed from now on."""
        now = self.clock()
        with self._lock:
            self._outstanding.update(dict.fromkeys(job_ids, now))
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        next_sweep = 0.0
        while not stop.is_set():
            now = self.clock()
            try:
                if now >= next_sweep:
                    while len(self.publish(None)) == LIMIT and not stop.is_set():
                        pass
                    next_sweep = now + SWEEP_S
                for ids in self._probe(now):
                    self.publish(ids)
            except Exception:  # the database or Redis went away: sweep when they are back
                logger.exception("stream results not published; trying again")
                next_sweep = 0.0
                stop.wait(1.0)
                continue
            if self._outstanding:  # one publish per poll gathers many finished batches
                stop.wait(POLL_S)
            else:  # idle: until the next sweep, or until the consumer accepts jobs
                self._wake.wait(max(0.0, next_sweep - self.clock()))
                self._wake.clear()

    def _probe(self, now: float) -> list[list[uuid.UUID]]:
        """The oldest outstanding jobs, in pieces of LIMIT; those followed longer
        than MAX_FOLLOW_S are left to the sweep, so the probe stays small."""
        with self._lock:
            stale = [i for i, at in self._outstanding.items() if now - at > MAX_FOLLOW_S]
            for job_id in stale:
                del self._outstanding[job_id]
            ids = list(itertools.islice(self._outstanding, PROBE))
        return [ids[start : start + LIMIT] for start in range(0, len(ids), LIMIT)]

    def publish(self, job_ids: list[uuid.UUID] | None) -> list[Finished]:
        """Publish the finished ones among `job_ids` (None: any), up to LIMIT."""
        with self.scope():
            done = self.operations.publish_results(self._send, job_ids=job_ids, limit=LIMIT)
        if done:
            with self._lock:
                for item in done:
                    self._outstanding.pop(item.job_id, None)
            if self.guards.dedupe:  # committed: no publisher can take these again
                self.logs.release([DEDUPE_KEY.format(job_id=i.job_id) for i in done])
        return done

    def _send(self, items: list[Finished]) -> None:
        by_log: dict[str, list[Finished]] = {}
        for item in items:
            by_log.setdefault(item.output, []).append(item)
        for log, found in by_log.items():
            if self.guards.dedupe:
                self.logs.append_once(
                    log,
                    [(DEDUPE_KEY.format(job_id=i.job_id), codec.result(i)) for i in found],
                    self.keep_s,
                )
            else:
                self.logs.append_many(log, [codec.result(i) for i in found])
        for item in items:
            metrics.STREAM_RESULTS.labels(item.status).inc()
        self.checkpoint("published")  # appended, not yet recorded: where a crash hurts
