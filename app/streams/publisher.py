"""Results to the output logs, each exactly once, through the outbox.

`stream_entries` is the outbox: an entry whose job ended and whose
`published_at` is NULL has a result to append. The publisher takes such entries
(locked, so two publishers never hold the same ones), appends one output entry
each, in one pipelined round trip per log, then marks them published in the same
transaction. A publisher that dies after appending and before that commit would
append them again: each append is a small Redis script that sets a mark for the
job (NX, kept STREAMS_DEDUPE_SECONDS) and appends only if it set it, atomically,
so the second try appends nothing.

When to look: PostgreSQL already NOTIFYs the ids of every job that changes
(`job_events`, for event streams), and the event bus hands them over, so the
publisher queries exactly the jobs it accepted that changed (an index probe per
job), instead of polling every unpublished entry. Polling a 10,000-entry backlog
every 50 ms reads 10,000 rows each time, most of them still queued. A sweep of
every unpublished entry runs at start (results that finished while no consumer
ran), after the listener reconnects, and every SWEEP_S (entries another
consumer accepted and then died with).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable

from app.bindings.entries import Finished
from app.dataplane import DataPlane
from app.jobs.events import EventBus
from app.jobs.guards import Guards
from app.observability import metrics
from app.platform.database import Database
from app.platform.logstreams import LogEngine
from app.streams import codec, unstaged

logger = logging.getLogger(__name__)

SWEEP_S = 2.0
LIMIT = 512
DEDUPE_KEY = "inference:stream-sent:{job_id}"


class Publisher:
    """One per consumer process, on its own thread."""

    def __init__(
        self,
        plane: DataPlane,
        database: Database,
        logs: LogEngine,
        events: EventBus,
        guards: Guards,
        keep_s: float,
        *,
        checkpoint: Callable[[str], None] = unstaged,
    ) -> None:
        self.plane, self.database, self.logs, self.events = plane, database, logs, events
        self.guards, self.keep_s, self.checkpoint = guards, keep_s, checkpoint
        self._lock = threading.Lock()
        self._outstanding: set[str] = set()  # jobs this process accepted, unpublished
        self._candidates: set[str] = set()  # of those, the ones that changed
        self._sweep = True
        self._wake = threading.Event()

    def accepted(self, job_ids: Iterable[uuid.UUID]) -> None:
        """Jobs the consumer just made. They are looked at once now: one may have
        finished before this call, its NOTIFY heard while it was not followed."""
        ids = {str(job_id) for job_id in job_ids}
        with self._lock:
            self._outstanding |= ids
            self._candidates |= ids
        self._wake.set()

    def heard(self, job_ids: list[str] | None) -> None:
        """The event bus's callback: jobs that changed, or None (sweep: changes may
        have gone unheard)."""
        if job_ids is None:
            self._sweep = True
            self._wake.set()
            return
        with self._lock:
            hits = self._outstanding.intersection(job_ids)
            self._candidates |= hits
        if hits:
            self._wake.set()

    def run(self, stop: threading.Event) -> None:
        self.events.subscribe(self.heard)
        next_sweep = 0.0
        while not stop.is_set():
            self._wake.wait(max(0.0, min(SWEEP_S, next_sweep - time.monotonic())))
            self._wake.clear()
            try:
                with self._lock:
                    ids, self._candidates = list(self._candidates), set()
                for start in range(0, len(ids), LIMIT):
                    self.publish([uuid.UUID(i) for i in ids[start : start + LIMIT]])
                if self._sweep or time.monotonic() >= next_sweep:
                    self._sweep = False
                    while len(self.publish(None)) == LIMIT and not stop.is_set():
                        pass
                    next_sweep = time.monotonic() + SWEEP_S
            except Exception:  # the database or Redis went away: sweep when they are back
                logger.exception("stream results not published; trying again")
                self._sweep = True
                stop.wait(1.0)

    def publish(self, job_ids: list[uuid.UUID] | None) -> list[Finished]:
        """Publish the finished ones among `job_ids` (None: any), up to LIMIT."""
        with self.database.scope():
            done = self.plane.publish_results(self._send, job_ids=job_ids, limit=LIMIT)
        if done:
            with self._lock:
                self._outstanding.difference_update(str(item.job_id) for item in done)
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
