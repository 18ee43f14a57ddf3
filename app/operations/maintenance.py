"""Beat's periodic sweeps over the jobs and what they leave: PostgreSQL is the
truth, the broker only a hint. Each step is a guarded UPDATE on one slice of the
jobs table (app.jobs.transitions), safe to run concurrently or twice, and a unit
of work of its own (a purge, a piece of rows a unit), so one that fails leaves
the others done and none holds a lock for long.

- leases: jobs whose worker died go back to the queue (or fail at their cap);
- waiting: models with jobs back from a retry's backoff, jobs whose wake-up
  failed to publish, or jobs queued too long (a wake-up lost with the broker)
  get a wake-up; wake-ups are per model, so a backlog costs one message;
- deadlines: jobs past their deadline expire;
- retention: old inputs and outputs are deleted a piece at a time, idempotency
  keys after 24 h, each log jobs leave after its own setting, and finished jobs'
  and batches' rows after theirs (app.jobs.retention).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.orm import Session

from app.batches import retention as batch_retention
from app.execution.dispatch import Dispatcher
from app.jobs import idempotency, retention, transitions
from app.jobs.guards import ALL_ON, Guards
from app.jobs.retention import Rule
from app.platform.database import Database
from app.platform.filestore import FileStore
from app.platform.settings import Settings
from app.tenancy import keys

__all__ = ["Maintenance", "MaintenanceSettings"]

logger = logging.getLogger(__name__)

# Rows a step touches at most: a sweep's UPDATE, a purge's piece.
BATCH = 500

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class MaintenanceSettings:
    """RETRY_BACKOFF_SECONDS and RETRY_BACKOFF_MAX_SECONDS (for jobs taken back from
    a dead worker), REPUBLISH_AFTER_SECONDS (a queued job seen by no worker for that
    long gets a new wake-up), RETENTION_SECONDS (jobs' inputs and outputs, batches'
    objects), JOB_RETENTION_SECONDS (finished jobs' and batches' rows) and each
    log's own retention (app.jobs.retention)."""

    backoff_s: float
    backoff_max_s: float
    republish_after_s: float
    retention_s: float
    rules: tuple[tuple[Rule, float], ...]
    job_retention_s: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> MaintenanceSettings:
        return cls(
            settings.retry_backoff_seconds, settings.retry_backoff_max_seconds,
            settings.republish_after_seconds, settings.retention_seconds,
            tuple(retention.rules(settings)), settings.job_retention_seconds,
        )  # fmt: skip


class Maintenance:
    def __init__(
        self,
        database: Database,
        dispatcher: Dispatcher,
        store: FileStore,
        settings: MaintenanceSettings,
        guards: Guards = ALL_ON,
    ) -> None:
        """`guards`: the lease and republish steps run while theirs are on (always,
        but in the fault suite)."""
        self.database, self._dispatcher, self._store = database, dispatcher, store
        self.settings, self.guards = settings, guards

    def sweep(self) -> dict[str, int]:
        """Take back dead workers' jobs, expire overdue ones, wake what waits unseen."""
        counts: dict[str, int] = {}
        settings = self.settings
        if self.guards.lease:
            taken = self._step(transitions.take_back_expired_leases,
                               settings.backoff_s, settings.backoff_max_s, BATCH)  # fmt: skip
            counts["requeued_after_lost_worker"] = len(taken)
        counts["expired"] = self._step(transitions.expire_overdue, BATCH)
        if self.guards.republish:
            counts["woken_for"] = self.wake_waiting(settings.republish_after_s)
        if any(counts.values()):
            logger.info("sweep: %s", counts)
        return counts

    def wake_waiting(self, older_than_s: float) -> int:
        """Wake every model whose due jobs no wake-up may be on its way for (marked
        sent first, in a unit of its own); how many jobs that concerned."""
        waiting = self._step(transitions.models_waiting, older_than_s)
        for model in waiting:
            self._dispatcher.wake(model, force=True)
        return sum(waiting.values())

    def purge(self) -> dict[str, Any]:
        """Delete what retention says is old: idempotency keys after 24 h; jobs' inputs
        and outputs and batches' objects after RETENTION_SECONDS (0: kept); rotated-
        out webhook secrets after their overlap; each log after its own setting."""
        keys_forgotten = self._step(idempotency.forget_expired)
        purged = objects = 0
        if (age := self.settings.retention_s) > 0:
            while count := self._step(transitions.purge_old_data, age, BATCH):
                purged += count
            objects = self.purge_batch_objects(age)
        secrets = self._step(keys.forget_previous_secrets)
        pruned = {rule.name: self.prune(rule, age) for rule, age in self.settings.rules if age > 0}
        if (age := self.settings.job_retention_s) > 0:
            pruned.update(self.delete_old_rows(age))
        if any(pruned.values()):
            logger.info("retention: %s", pruned)
        return {"purged": purged, "batch_objects": objects, "idempotency_keys": keys_forgotten,
                "previous_webhook_secrets": secrets, **pruned}  # fmt: skip

    def delete_old_rows(self, older_than_s: float) -> dict[str, int]:
        """Finished jobs and batches older than `older_than_s`, deleted with what
        hangs on them, a piece a unit, at most MAX_BATCHES pieces a run (the next
        run goes on); how many jobs (chunks included) and batches."""
        budget = iter(range(retention.MAX_BATCHES))  # the run's pieces, shared
        jobs, _ = self._in_pieces(budget, retention.delete_old_jobs, older_than_s)
        batches = 0
        for batch_id in self._step(batch_retention.expired, older_than_s, BATCH):
            chunks, done = self._in_pieces(
                budget, batch_retention.delete_chunks, batch_id, retention.BATCH
            )
            jobs += chunks
            if not done:
                break
            self._step(batch_retention.delete_batch, self._store, batch_id)
            batches += 1
        return {"jobs": jobs, "batches": batches}

    def _in_pieces(
        self, budget: Iterator[int], step: Callable[..., int], *args: Any
    ) -> tuple[int, bool]:
        """`step` (which deletes up to retention.BATCH rows, and says how many) as a
        unit of work each, while `budget` lasts: the rows deleted, and whether a
        short piece said none are left."""
        total = 0
        for _ in budget:
            count = self._step(step, *args)
            total += count
            if count < retention.BATCH:
                return total, True
        return total, False

    def purge_batch_objects(self, older_than_s: float) -> int:
        """Delete the file store's objects of batches finished longer ago than
        `older_than_s`, a batch a unit (its mark commits once its objects are gone,
        so a failed delete is tried again at the next purge); how many batches."""
        done = 0
        while True:
            session = self.database.session()
            ids = batch_retention.old_batches(session, older_than_s, BATCH)
            self.database.end_reads()
            for batch_id in ids:
                self._step(batch_retention.purge_objects, self._store, batch_id)
            done += len(ids)
            if len(ids) < BATCH:
                return done

    def prune(self, rule: Rule, older_than_s: float) -> int:
        """Rows of `rule` older than `older_than_s`, deleted (or cleared) a piece a
        unit, at most MAX_BATCHES pieces a run (the next run goes on)."""
        total, after = 0, 0
        for _ in range(retention.MAX_BATCHES):
            ids = self._step(retention.prune_piece, rule, older_than_s, after)
            total += len(ids)
            if len(ids) < retention.BATCH:
                break
            after = max(ids)
        return total

    def _step(
        self, step: Callable[Concatenate[Session, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """One step on the scope's session, as a unit of work of its own."""
        with self.database.unit_of_work() as session:
            return step(session, *args, **kwargs)
