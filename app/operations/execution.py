"""The workers' side of every job: claim, run, finish, answer, settle.

`drain` serves a wake-up for one model: it claims that model's queued jobs in
batches (one UPDATE ... SKIP LOCKED each), runs each batch through the one job
runner (app.execution.runner), and writes every outcome in one UPDATE. `execute` does
the same for jobs named by id. The claim, the finish and the settle of a batch's
chunks are each a unit of work; no transaction is held while a model runs
(except a read of a chunk's rows kept in PostgreSQL), and sync callers are
answered only once their job's record is committed.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from app.execution.dispatch import DRAIN_TASK, PURGE_TASK, SWEEP_TASK, Dispatcher
from app.execution.runner import Runner
from app.jobs import claims, steps, telemetry
from app.jobs.chunks import settle
from app.jobs.claims import ClaimedJob
from app.jobs.guards import Guards
from app.jobs.transitions import Outcome, finish_rows
from app.platform.database import Database, transactional
from app.platform.settings import Settings

__all__ = [
    "DRAIN_TASK",
    "PURGE_TASK",
    "SWEEP_TASK",
    "DrainSettings",
    "Execution",
    "Guards",
    "Outcome",
    "StepStore",
    "renew_leases",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainSettings:
    """How long a wake-up's task runs jobs (DRAIN_SECONDS) and how long it waits for
    more once the queue is empty (DRAIN_LINGER_MS)."""

    drain_s: float
    linger_s: float

    @classmethod
    def of(cls, settings: Settings) -> DrainSettings:
        return cls(settings.drain_seconds, settings.drain_linger_ms / 1000)


class Execution:
    def __init__(
        self, database: Database, runner: Runner, dispatcher: Dispatcher, settings: DrainSettings
    ) -> None:
        self.database, self.runner, self.settings = database, runner, settings
        self._dispatcher = dispatcher

    def queue_for(self, model: str) -> str:
        """The queue `model`'s wake-ups travel on (its card's, or DEFAULT_MODEL_QUEUE)."""
        return self._dispatcher.queue_for(model)

    def on_disk(self, model: str) -> bool:
        """Whether this worker's repository has the model (its card, to route by)."""
        return bool(self.runner.repository.on_disk(model))

    def generates(self, model: str) -> bool:
        """Whether `model` is generative: its jobs run in the decode loop
        (app.engine.core), not here."""
        card = self.runner.card(model)
        return card is not None and card.generation is not None

    def taken(self, model: str, queue: str | None) -> None:
        """A wake-up for `model` was taken (from `queue`): jobs committed from now on
        need a new one (app.execution.dispatch)."""
        self._dispatcher.taken(model, queue)

    def drain(self, model: str) -> int:
        """Run queued jobs of `model` until none is left or DRAIN_SECONDS passed.

        Each claim takes jobs until their rows fill one call (the card's
        max_batch_size). The batching delay is waited once, before the first claim,
        so a lone job waits at most that long for company. When more jobs wait than
        one claim took, `wake` is called first, so an idle worker process claims the
        next batch alongside this one; so does stopping on time with work left, so
        no job waits for the sweep. An empty claim ends the task only once the
        queue stayed empty for DRAIN_LINGER_MS: under steady load, jobs then join a
        running task instead of costing a new wake-up message each time.
        Returns the number of jobs run.
        """
        wake = partial(self._dispatcher.wake, model)
        card = self.runner.card(model)
        batching = card.batching if card else None
        max_rows = max(1, batching.max_batch_size) if batching else 1
        if batching and batching.max_queue_delay_ms:
            time.sleep(batching.max_queue_delay_ms / 1000)
        linger_s = self.settings.linger_s
        started = time.monotonic()
        stop_at, idle_until = started + self.settings.drain_s, started + linger_s
        done = 0
        while True:
            claimed, more = self._claim_next(model, max_rows)
            if not claimed:
                if time.monotonic() >= idle_until:
                    return done
                time.sleep(linger_s / 4)
                continue
            if more:
                wake()
            self.run_claimed(claimed)
            done += len(claimed)
            if time.monotonic() >= stop_at:
                wake()
                return done
            idle_until = time.monotonic() + linger_s

    def execute(self, job_ids: list[uuid.UUID]) -> list[Outcome]:
        """Claim these jobs (those claimable now) and run them."""
        claimed = self._claim(job_ids)
        if len(claimed) < len(job_ids):
            logger.info("skipped %d job(s) not claimable now", len(job_ids) - len(claimed))
        return self.run_claimed(claimed)

    def run_claimed(self, claimed: list[ClaimedJob]) -> list[Outcome]:
        """Run claimed jobs and write every outcome at once; then answer their sync
        callers and finish the batches whose last chunk this was."""
        if not claimed:
            return []
        outcomes = self.runner.run(self.database.session(), claimed)
        rows = self._finish(claimed, outcomes)
        written = {row.id for row in rows}
        self.runner.answer(claimed, outcomes, rows)  # after the commit: the record is there
        if batches := {job.batch_id for job in claimed if job.batch_id is not None}:
            self._settle(list(batches))  # after the commit: the last chunk's writer sees all
        for outcome in outcomes:
            if outcome.job_id not in written:
                logger.warning(
                    "job %s: outcome of attempt %s not written (the job moved on)",
                    outcome.job_id,
                    outcome.attempt,
                )
        return outcomes

    @transactional
    def _claim_next(self, model: str, max_rows: int) -> tuple[list[ClaimedJob], bool]:
        """The claim is visible once this unit commits, and the candidates it left
        (SKIP LOCKED) unlocked."""
        return claims.claim_next(
            self.database.session(), model, max_rows, self.runner.settings.lease_s,
            guarded=self.runner.guards.claim,
        )  # fmt: skip

    @transactional
    def _claim(self, job_ids: list[uuid.UUID]) -> list[ClaimedJob]:
        guards = self.runner.guards
        return claims.claim(
            self.database.session(), job_ids, self.runner.settings.lease_s,
            guarded=guards.claim, reclaim_expired=guards.lease,
        )  # fmt: skip

    @transactional
    def _finish(self, claimed: list[ClaimedJob], outcomes: list[Outcome]) -> list[Any]:
        session = self.database.session()
        rows = finish_rows(session, outcomes, guarded=self.runner.guards.finish)
        telemetry.finished(session, claimed, rows)  # metrics and a line per finished job
        return rows

    @transactional
    def _settle(self, batch_ids: list[uuid.UUID]) -> None:
        settle(self.database.session(), batch_ids)


class StepStore:
    """A pipeline job's finished steps (app.jobs.steps): each write a unit of work of
    its own, committed as the step finishes, beside the task's."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def load(self, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[tuple[str, int], bytes]]:
        with self.database.separate_unit_of_work() as session:
            return steps.recorded(session, job_ids)

    def write(self, rows: list[steps.StepRow]) -> None:
        with self.database.separate_unit_of_work() as session:
            steps.record(session, rows)


def renew_leases(database: Database, lease_s: float, jobs: list[ClaimedJob]) -> set[uuid.UUID]:
    """Extend the leases of jobs still running: the lease keeper's thread, a unit of
    work of its own beside any task's (app.execution.leases). Returns the ids still
    this worker's."""
    with database.separate_unit_of_work() as session:
        return claims.renew_leases(session, jobs, lease_s)
