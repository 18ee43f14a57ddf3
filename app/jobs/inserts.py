"""Coalesced job inserts: the API process's concurrent submits share one INSERT
and one commit (a unit of work of the writer thread's own).

Each submit hands its row to a writer thread and waits until the row is
committed, so a 202 still means the job is durable. While one batch is being
written, the submits that arrive meanwhile gather for the next: no added delay
when the API is quiet (a batch of one), and under load one statement, one
commit (one WAL flush) and one wake-up per model for many jobs, instead of one
each. A failed batch fails every submit in it with the same error (a database
outage is then a 503 for each, as before), and nothing of it is committed.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, insert

from app.jobs.tables import Job
from app.jobs.transitions import MARK_UNSENT
from app.platform.background import LazyThread
from app.platform.database import Database

logger = logging.getLogger(__name__)

_JOBS: Table = Job.__table__  # type: ignore[assignment]
# Server defaults come back in the same statement; every other column starts NULL.
_DEFAULTS = (_JOBS.c.created_at, _JOBS.c.enqueued_at, _JOBS.c.run_after)
INSERT_JOB = insert(_JOBS).returning(*_DEFAULTS)
# For a batch: the rows come back in any order, so each names its job.
INSERT_JOBS = insert(_JOBS).returning(_JOBS.c.id, *_DEFAULTS)

MAX_BATCH = 256


@dataclass
class _Pending:
    rows: list[dict[str, Any]]  # one submit's rows: always written in one batch
    done: threading.Event = field(default_factory=threading.Event)
    defaults: list[dict[str, Any]] | None = None
    error: BaseException | None = None


class JobInserter:
    """One per process; its thread starts on first use (after a fork). Without
    `wake`, it writes rows nobody runs: the records of calls that ran inline."""

    def __init__(self, database: Database, wake: Callable[[str], bool] | None) -> None:
        self._database = database
        self._wake = wake
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._writer = LazyThread(self._run, "job-inserts")

    def insert(self, values: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        """Insert one job row (committed when this returns); the server defaults."""
        return self.insert_many([values], timeout)[0]

    def insert_many(
        self, rows: list[dict[str, Any]], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Insert these rows together (all committed, or none, when this returns);
        each row's server defaults, in order."""
        pending = _Pending(rows)
        self._writer.ensure()
        self._queue.put(pending)
        if not pending.done.wait(timeout):
            raise TimeoutError("the job writer did not answer")
        if pending.error is not None:
            raise pending.error
        assert pending.defaults is not None
        return pending.defaults

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            rows = len(batch[0].rows)
            while rows < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
                rows += len(batch[-1].rows)
            self._write(batch)

    def _write(self, batch: list[_Pending]) -> None:
        try:
            with self._database.separate_unit_of_work() as session:
                rows = (
                    session.connection()
                    .execute(INSERT_JOBS, [v for p in batch for v in p.rows])
                    .all()
                )
        except BaseException as exc:  # handed to every waiting submit, which raises it
            for pending in batch:
                pending.error = exc
                pending.done.set()
            return
        defaults = {row.id: row._asdict() for row in rows}
        for pending in batch:
            pending.defaults = [defaults[values["id"]] for values in pending.rows]
            for written in pending.defaults:
                del written["id"]
        try:
            self._wake_models(batch)
        except Exception:  # committed all the same: the sweep wakes what is left
            logger.exception("could not wake workers for %d new job(s)", len(defaults))
        finally:
            for pending in batch:
                pending.done.set()

    def _wake_models(self, batch: list[_Pending]) -> None:
        if self._wake is None:
            return
        unsent: list[uuid.UUID] = []
        for model in {values["model"] for p in batch for values in p.rows}:
            if not self._wake(model):
                unsent += [v["id"] for p in batch for v in p.rows if v["model"] == model]
        if unsent:
            with self._database.separate_core_unit_of_work() as conn:
                conn.execute(MARK_UNSENT, {"ids": unsent})
