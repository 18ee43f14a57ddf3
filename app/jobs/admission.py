"""A bound on each model's queue: beyond MAX_QUEUED_PER_MODEL queued jobs, a
submit (async, sync or batch) is refused with 429 and a Retry-After computed
from how fast the model's jobs have been finishing, instead of the queue
growing without end or a client timing out.

Counting a model's queue costs an index scan, so each API process reads it at
most every `ttl_s` per model and counts its own admissions in between: the
bound is approximate by what one process admits in that time, never by more.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.errors import QueueFull

RATE_WINDOW_S = 10
_READ = text(
    f"""
    SELECT (SELECT count(*) FROM jobs WHERE model = :model AND status = 'queued') AS queued,
           (SELECT count(*) FROM jobs WHERE model = :model AND purged_at IS NULL
              AND finished_at > now() - interval '{RATE_WINDOW_S} seconds') AS finished
    """
)


@dataclass
class _Reading:
    queued: int
    per_s: float
    at: float


class Admission:
    """The bound, with each model's reading kept `ttl_s` by `clock` (seconds)."""

    def __init__(
        self, limit: int, ttl_s: float = 0.5, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit, self.ttl_s, self.clock = limit, ttl_s, clock
        self._readings: dict[str, _Reading] = {}
        self._lock = threading.Lock()

    def admit(self, session: Session, model: str, jobs: int = 1) -> None:
        """Count `jobs` more into `model`'s queue, or raise QueueFull."""
        if self.limit <= 0:
            return
        reading = self._reading(session, model)
        with self._lock:
            if reading.queued + jobs > self.limit:
                excess = reading.queued + jobs - self.limit
                wait = min(300, max(1, math.ceil(excess / max(reading.per_s, 1 / 60))))
                raise QueueFull(
                    f"model {model!r} has {reading.queued} jobs queued and takes at most "
                    f"{self.limit} (MAX_QUEUED_PER_MODEL); at the rate its jobs finish, "
                    f"retry in about {wait} s",
                    retry_after=wait, queued=reading.queued, limit=self.limit,
                )  # fmt: skip
            reading.queued += jobs

    def _reading(self, session: Session, model: str) -> _Reading:
        now = self.clock()
        reading = self._readings.get(model)
        if reading is None or now - reading.at > self.ttl_s:
            row = session.execute(_READ, {"model": model}).one()
            reading = _Reading(row.queued, row.finished / RATE_WINDOW_S, now)
            self._readings[model] = reading
        return reading
