"""What a decode loop reads and writes in the database: its job-store port.

Each method is one unit of work (claims, the recorded tokens a retry goes on
from, the pieces of text recorded as they come, the finishing write), so the
loop itself (app.engine.core) holds no session and its passes read as
policy: claim, start, step, end.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from app.execution.runner import Runner
from app.jobs import claims, telemetry
from app.jobs.chunks import settle
from app.jobs.claims import ClaimedJob
from app.jobs.outputs import Piece, record, recorded_logprobs, recorded_tokens
from app.jobs.transitions import Outcome, finish_rows
from app.platform.database import Database, transactional


class Clock:
    """What the core's timers read and its idle waits sleep: the process's own
    monotonic clock (tests pass one that moves only when they say)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


MONOTONIC = Clock()


class JobStore(Protocol):
    """The core's port to the jobs it runs: what it claims, records and finishes
    (GenerationStore in PostgreSQL; tests pass one in memory)."""

    def heads(self, model: str) -> list[claims.Head]: ...
    def claim(self, job_ids: list[uuid.UUID]) -> list[ClaimedJob]: ...
    def claim_next(self, model: str, version: str, room: int) -> tuple[list[ClaimedJob], bool]: ...
    def claimable(self, model: str) -> bool: ...
    def cancel_requested(self, job_ids: list[uuid.UUID]) -> list[uuid.UUID]: ...
    def give_back(self, pieces: list[Piece], jobs: list[ClaimedJob]) -> set[uuid.UUID]: ...
    def recorded(self, job_id: uuid.UUID) -> list[int]: ...
    def recorded_logprobs(self, job_id: uuid.UUID) -> list[dict[str, Any]]: ...
    def record(self, pieces: list[Piece]) -> None: ...
    def settle(self, batch_ids: list[uuid.UUID]) -> None: ...
    def write(
        self, outcomes: list[Outcome], jobs: list[ClaimedJob], pieces: list[Piece]
    ) -> list[Any]: ...
    def run(self, jobs: list[ClaimedJob]) -> list[Outcome]: ...


class GenerationStore:
    def __init__(self, database: Database, runner: Runner) -> None:
        self.database, self._runner = database, runner

    @transactional
    def heads(self, model: str) -> list[claims.Head]:
        """The first waiting job of each tenant (its version, priority)."""
        return claims.waiting_heads(self.database.session(), model)

    @transactional
    def claim(self, job_ids: list[uuid.UUID]) -> list[ClaimedJob]:
        """These waiting jobs, those still queued (another loop may have some)."""
        return claims.claim(
            self.database.session(), job_ids, self._runner.settings.lease_s,
            guarded=self._runner.guards.claim, reclaim_expired=False,
        )  # fmt: skip

    @transactional
    def claim_next(self, model: str, version: str, room: int) -> tuple[list[ClaimedJob], bool]:
        """Up to `room` of the version's queued jobs, fair between tenants; and
        whether more wait."""
        return claims.claim_next(
            self.database.session(), model, room, self._runner.settings.lease_s,
            guarded=self._runner.guards.claim, version=version,
        )  # fmt: skip

    def claimable(self, model: str) -> bool:
        with self.database.separate_core_unit_of_work() as connection:
            return claims.any_queued(connection, model)

    def cancel_requested(self, job_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        with self.database.separate_core_unit_of_work() as connection:
            return list(claims.cancel_requested(connection, job_ids))

    @transactional
    def give_back(self, pieces: list[Piece], jobs: list[ClaimedJob]) -> set[uuid.UUID]:
        """The text made so far recorded, and the jobs queued again (a hand-over)."""
        session = self.database.session()
        record(session, pieces)
        return claims.hand_back(session, jobs)

    @transactional
    def recorded(self, job_id: uuid.UUID) -> list[int]:
        return recorded_tokens(self.database.session(), job_id)

    @transactional
    def recorded_logprobs(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return recorded_logprobs(self.database.session(), job_id)

    @transactional
    def record(self, pieces: list[Piece]) -> None:
        record(self.database.session(), pieces)

    @transactional
    def settle(self, batch_ids: list[uuid.UUID]) -> None:
        settle(self.database.session(), batch_ids)

    def run(self, jobs: list[ClaimedJob]) -> list[Outcome]:
        """Jobs of a version no loop serves, run the way any job runs (the runner
        fails them `model_unavailable`, or runs them)."""
        return self._runner.run(self.database.session(), jobs)

    @transactional
    def write(
        self, outcomes: list[Outcome], jobs: list[ClaimedJob], pieces: list[Piece]
    ) -> list[Any]:
        """The pieces recorded and the outcomes written (a finished job's last
        pieces before its terminal event), in one unit."""
        session = self.database.session()
        record(session, pieces)
        rows = finish_rows(session, outcomes, guarded=self._runner.guards.finish)
        telemetry.finished(session, jobs, rows)
        return rows
