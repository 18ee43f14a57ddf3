"""The status page's numbers, from a few bounded queries.

- queue depth and the oldest queued job per model: an index-only scan of the
  claim index (`ix_jobs_claim`, queued jobs only), so its cost is the number of
  queued jobs (at most MAX_QUEUED_PER_MODEL a model), never the table's size;
- running jobs: the lease index (running jobs only: a few per worker);
- jobs finished in the window: the retention index on `finished_at` (jobs whose
  data is still kept), so the window is an hour or RETENTION_SECONDS if shorter;
- dead letters not replayed: counted up to a cap;
- the newest dead letters (operators only): the primary key, newest first, LIMIT.

Every query runs under a statement timeout, and `StatusBoard` keeps the numbers
for STATUS_CACHE_SECONDS per process, so the page cannot be used to load the
database however often it is fetched.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.orm import Session

from app.status.census import Census, WorkerCensus
from app.status.streams import StreamLine, StreamTotals
from app.statuses import TERMINAL, ordered

WINDOW_S = 3600.0
DEAD_LETTER_CAP = 10_000
RECENT_LIMIT = 20
STATEMENT_TIMEOUT_MS = 3000
FINISHED_STATUSES = ordered(TERMINAL)


@dataclass(frozen=True)
class ModelLine:
    """One model's queue and throughput; `model` None stands for the models not
    open to every tenant, together (their names are not public)."""

    model: str | None
    queued: int = 0
    oldest_queued_s: float | None = None
    running: int = 0
    finished: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: ModelLine) -> ModelLine:
        ages = [a for a in (self.oldest_queued_s, other.oldest_queued_s) if a is not None]
        return ModelLine(
            self.model,
            self.queued + other.queued,
            max(ages) if ages else None,
            self.running + other.running,
            {s: self.finished.get(s, 0) + other.finished.get(s, 0) for s in FINISHED_STATUSES},
        )


@dataclass(frozen=True)
class Snapshot:
    at: datetime
    window_s: float
    models: list[ModelLine]
    open_dead_letters: int  # not replayed, counted up to DEAD_LETTER_CAP + 1
    census: Census
    streams: list[StreamLine] = field(default_factory=list)  # the stream door's bindings
    stream_totals: StreamTotals = field(default_factory=StreamTotals)

    @property
    def totals(self) -> ModelLine:
        total = ModelLine(None, finished=dict.fromkeys(FINISHED_STATUSES, 0))
        for line in self.models:
            total = total + line
        return total

    @property
    def dead_letters_capped(self) -> bool:
        return self.open_dead_letters > DEAD_LETTER_CAP

    def public(self, public_models: set[str]) -> Snapshot:
        """Models not open to every tenant folded into one line: their names are
        for their tenants and operators only; so are the stream bindings (their
        log names name tenants): only their totals are public."""
        shown = [line for line in self.models if line.model in public_models]
        hidden = [line for line in self.models if line.model not in public_models]
        if hidden:
            folded = ModelLine(None, finished=dict.fromkeys(FINISHED_STATUSES, 0))
            for line in hidden:
                folded = folded + replace(line, model=None)
            shown.append(folded)
        return replace(self, models=shown, streams=[])


@dataclass(frozen=True)
class LetterLine:
    """A dead letter as an operator sees it on the page (never the job's inputs)."""

    id: int
    kind: str  # "job" or "webhook"
    job_id: uuid.UUID | None
    batch_id: uuid.UUID | None
    tenant: str
    model: str
    model_version: str
    error_code: str
    error_class: str
    message: str
    attempts: int
    last_failed_at: datetime
    replayed_at: datetime | None


_QUEUED = text(
    """
    SELECT model, count(*) AS queued,
           extract(epoch FROM now() - min(created_at)) AS oldest_s
    FROM jobs WHERE status = 'queued' GROUP BY model
    """
)
_RUNNING = text(
    "SELECT model, count(*) AS running FROM jobs WHERE status = 'running' GROUP BY model"
)
_FINISHED = text(
    """
    SELECT model, status, count(*) AS jobs FROM jobs
    WHERE purged_at IS NULL AND finished_at IS NOT NULL
      AND finished_at > now() - make_interval(secs => :window)
    GROUP BY model, status
    """
)
_OPEN_LETTERS = text(
    "SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE replayed_at IS NULL LIMIT :cap) s"
)
_RECENT_LETTERS = text(
    """
    SELECT d.id, d.job_id, d.batch_id, d.delivery_id, t.name AS tenant, d.model,
           d.model_version, d.error_code, d.error_class, left(d.message, 300) AS message,
           d.attempts, d.last_failed_at, d.replayed_at
    FROM dead_letters d JOIN tenants t ON t.id = d.tenant_id
    ORDER BY d.id DESC LIMIT :limit
    """
)


def window_for(retention_s: float) -> float:
    """An hour, or the retention period if shorter: finished jobs whose data was
    purged leave the index the count reads, so a longer window would undercount."""
    return min(WINDOW_S, retention_s) if retention_s > 0 else WINDOW_S


def _bounded(session: Session) -> None:
    session.execute(text(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}"))


def read_models(session: Session, window_s: float) -> list[ModelLine]:
    """Every model with queued, running or recently finished jobs, by name."""
    _bounded(session)
    queued = {r.model: (r.queued, float(r.oldest_s)) for r in session.execute(_QUEUED)}
    running = {r.model: r.running for r in session.execute(_RUNNING)}
    finished: dict[str, dict[str, int]] = {}
    for r in session.execute(_FINISHED, {"window": window_s}):
        finished.setdefault(r.model, dict.fromkeys(FINISHED_STATUSES, 0))[r.status] = r.jobs
    return [
        ModelLine(
            model,
            queued.get(model, (0, None))[0],
            queued.get(model, (0, None))[1],
            running.get(model, 0),
            finished.get(model, dict.fromkeys(FINISHED_STATUSES, 0)),
        )
        for model in sorted(queued.keys() | running.keys() | finished.keys())
    ]


def count_open_dead_letters(session: Session) -> int:
    """Dead letters not replayed, up to DEAD_LETTER_CAP + 1 (shown as "10000+")."""
    _bounded(session)
    count = int(session.execute(_OPEN_LETTERS, {"cap": DEAD_LETTER_CAP + 1}).scalar_one())
    return count


def recent_dead_letters(session: Session, limit: int = RECENT_LIMIT) -> list[LetterLine]:
    """The newest dead letters of every tenant (failed jobs and undeliverable
    webhooks): for operators."""
    _bounded(session)
    rows = session.execute(_RECENT_LETTERS, {"limit": limit}).all()
    return [_letter(r) for r in rows]


def _letter(r: Row[Any]) -> LetterLine:
    kind = "webhook" if r.delivery_id is not None else "job"
    return LetterLine(
        r.id, kind, r.job_id, r.batch_id, r.tenant, r.model, r.model_version, r.error_code,
        r.error_class, r.message, r.attempts, r.last_failed_at, r.replayed_at,
    )  # fmt: skip


class StatusBoard:
    """The snapshot of one API process, read again when older than `ttl_s` by
    `clock` (seconds)."""

    def __init__(
        self,
        census: WorkerCensus,
        retention_s: float,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        streams: Callable[[Session], list[StreamLine]] | None = None,
    ) -> None:
        """`streams`: reads the stream bindings' lag (None: the page shows none)."""
        self.census, self.ttl_s, self.clock = census, ttl_s, clock
        self.streams = streams
        self.window_s = window_for(retention_s)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._at = 0.0

    def snapshot(self, session: Session) -> Snapshot:
        with self._lock:
            if self._snapshot is None or self.clock() - self._at >= self.ttl_s:
                streams = self.streams(session) if self.streams else []
                self._snapshot = Snapshot(
                    at=datetime.now(UTC),
                    window_s=self.window_s,
                    models=read_models(session, self.window_s),
                    open_dead_letters=count_open_dead_letters(session),
                    census=self.census.current(),
                    streams=streams,
                    stream_totals=StreamTotals.of(streams),
                )
                self._at = self.clock()
            return self._snapshot


@dataclass(frozen=True)
class Status:
    """What a viewer of the page may see: for the public, models not open to
    every tenant folded into one line and no dead letter named; for operators,
    every model and the newest dead letters."""

    snapshot: Snapshot
    operator: bool
    letters: list[LetterLine] = field(default_factory=list)


def read_status(
    session: Session, board: StatusBoard, public_models: set[str], *, operator: bool
) -> Status:
    snapshot = board.snapshot(session)
    if not operator:
        return Status(snapshot.public(public_models), operator=False)
    return Status(snapshot, operator=True, letters=recent_dead_letters(session))
