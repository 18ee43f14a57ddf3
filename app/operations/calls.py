"""Sync calls: a caller waits for a model's outputs, within a deadline.

A call becomes an ordinary job (the one submission path, ahead of every async job
of its model), so the workers that own the GPU run it in their micro-batches;
its answer comes back over this process's reply channel (app.jobs.replies), or
is read from PostgreSQL. A card with `"execution": "inline"` runs here instead,
through the same inference function, and its record is written before the
caller is answered. The HTTP and gRPC doors call these; a gRPC stream follows
many calls at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.cards import ModelCard
from app.errors import CallerLeft, DomainError, InferenceFailed
from app.jobs import staging, sync
from app.jobs.inserts import JobInserter
from app.jobs.replies import Replies
from app.jobs.sync import TEXT_OUTPUT, Answer, Call, Calls, ended_without_outputs
from app.jobs.tables import SYNC_PRIORITY
from app.observability import metrics
from app.operations.holds import Holds
from app.operations.jobs import JobOperations
from app.operations.requests import InferRequest, JobRequest
from app.operations.submission import Submitter
from app.platform.database import Database
from app.runtime.sessions import SessionPool
from app.tenancy.keys import TenantRef

__all__ = [
    "TEXT_OUTPUT", "Answer", "Call", "CallOperations", "CallSettings", "Calls",
    "ended_without_outputs",
]  # fmt: skip


@dataclass(frozen=True)
class CallSettings:
    """How long a caller waits: SYNC_TIMEOUT_SECONDS unless the call says, never
    more than MAX_WAIT_SECONDS."""

    timeout_s: float
    max_wait_s: float


class CallOperations:
    def __init__(
        self,
        database: Database,
        submitter: Submitter,
        jobs: JobOperations,
        holds: Holds,
        replies: Replies,
        inline: InlineRuns,
        settings: CallSettings,
    ) -> None:
        self.database, self._submitter, self._jobs = database, submitter, jobs
        self._holds, self._replies, self._inline = holds, replies, inline
        self.settings = settings

    def infer(
        self,
        tenant: TenantRef,
        request: InferRequest,
        *,
        leaving: Callable[[Callable[[], None]], object] | None = None,
    ) -> Answer:
        """Outputs for `request` within its timeout, holding one of the tenant's waits.

        Raises InputsDoNotFit before anything runs, InferenceFailed when the model
        failed the request, DeadlinePassed (naming the job) when it is unfinished.
        A door whose caller can go away early passes `leaving`, how to hear of it
        (gRPC's `context.add_callback`): the wait then ends, the job is cancelled,
        and CallerLeft is raised.
        """
        with self._holds.holding(tenant.id):
            call = self.start_call(tenant, request)
            if call.done is not None:
                return call.done
            assert call.job_id is not None
            with closing(self.follow_calls(tenant)) as calls:
                calls.add(call)
                if leaving is not None:
                    leaving(calls.leave)
                while not calls.left:
                    for _, ended in calls.finished(call.timeout_s):
                        if isinstance(ended, DomainError):
                            raise ended
                        return ended
            self._jobs.cancel_many(tenant, [call.job_id])
            raise CallerLeft(f"the caller left before job {call.job_id} finished; cancelled")

    def start_call(self, tenant: TenantRef, request: InferRequest) -> Call:
        """Check a sync call and submit its job, ahead of every async job of its
        model, without waiting for it (an inline model runs now: the call comes
        back done). For a door that follows many calls at once (`follow_calls`)."""
        card = self._submitter.card(tenant, request.model, request.version)
        timeout_s = self._timeout(request)
        give_up_at = time.monotonic() + timeout_s
        if sync.runs_inline(card):
            arrays = staging.check_inputs(card, request.inputs)
            self._submitter.admit_calls(tenant)
            self.database.end_reads()  # the admission's reads: the run holds no connection
            done = self._inline.run(tenant, card, arrays)
            return Call(card, done.job_id, timeout_s, give_up_at, done)
        job = self._submitter.submit(tenant, card, self._job(card, request))  # holds no reads
        return Call(card, job.id, timeout_s, give_up_at)

    def start_calls(
        self, tenant: TenantRef, requests: Sequence[InferRequest]
    ) -> list[Call | DomainError]:
        """`start_call` for many calls at once (a stream's requests that arrived
        together): their jobs in one `submit_many`, each call's error its own."""
        now = time.monotonic()
        started: list[Call | DomainError | None] = [None] * len(requests)
        queued: list[tuple[int, ModelCard, float]] = []
        jobs: list[JobRequest] = []
        cards = self._submitter.cards(tenant)
        for index, request in enumerate(requests):
            try:
                card = cards(request.model, request.version)
                if sync.runs_inline(card):
                    started[index] = self.start_call(tenant, request)
                    continue
            except DomainError as exc:
                started[index] = exc
                continue
            queued.append((index, card, self._timeout(request)))
            jobs.append(self._job(card, request))
        submitted = self._submitter.submit_many(tenant, jobs)
        for (index, card, timeout_s), job in zip(queued, submitted, strict=True):
            started[index] = (
                job if isinstance(job, DomainError)
                else Call(card, job.id, timeout_s, now + timeout_s)
            )  # fmt: skip
        done = [call for call in started if call is not None]
        assert len(done) == len(requests), "each call is started or has its error"
        return done

    def follow_calls(self, tenant: TenantRef, gather_s: float = 0.0) -> Calls:
        """A follower for many of the tenant's calls (`start_call`): add each, then
        take them back as they end. Close it when done. `gather_s`: how long to let
        changes gather after the first before reading them (for many calls: fewer
        reads, each answer that much later)."""
        return Calls(self.database.engine, self._replies.follow(), tenant.id, gather_s)

    def hold(self, tenant: TenantRef) -> Callable[[], None]:
        """One of the tenant's waits, for a door that keeps a caller waiting for
        long (a gRPC stream); TooManyWaits beyond its share. Returns its release."""
        return self._holds.acquire(tenant.id)

    def cancel(self, tenant: TenantRef, job_ids: list[uuid.UUID]) -> int:
        """Cancel the unfinished jobs of calls whose caller went away."""
        return self._jobs.cancel_many(tenant, job_ids)

    def _timeout(self, request: InferRequest) -> float:
        """How long a sync call's caller waits: its own timeout, else
        SYNC_TIMEOUT_SECONDS; never more than MAX_WAIT_SECONDS."""
        settings = self.settings
        return min(request.timeout_s or settings.timeout_s, settings.max_wait_s)

    def _job(self, card: ModelCard, request: InferRequest) -> JobRequest:
        """A sync call's job: ahead of every async job of its model (a caller waits),
        its answer sent to this process's reply channel."""
        return JobRequest(
            card.name, request.inputs, version=card.version, priority=SYNC_PRIORITY,
            deadline=request.deadline, reply_to=self._replies.channel,
            parameters=request.parameters if card.generation is not None else None,
        )  # fmt: skip


class InlineRuns:
    """Calls of inline models, run in this process; each leaves its job record
    (succeeded or failed), written with the process's other records in one group
    commit before the caller is answered: the call is in GET /jobs/<id> and
    /usage like any job."""

    def __init__(self, sessions: Callable[[], SessionPool], records: JobInserter) -> None:
        self._sessions, self._records = sessions, records

    def run(self, tenant: TenantRef, card: ModelCard, arrays: dict[str, Any]) -> Answer:
        started_at, clock = datetime.now(UTC), time.perf_counter()
        outputs, failure = None, None
        try:
            outputs = sync.run_inline(self._sessions(), card, arrays).outputs
        except InferenceFailed as exc:
            failure = exc
        error = None if failure is None else (str(failure.extra.get("error_code")), failure.detail)
        record = staging.record_values(
            card, arrays, tenant.id, started_at, time.perf_counter() - clock,
            outputs=outputs, error=error,
        )  # fmt: skip
        self._records.insert(record)
        metrics.JOBS_SUBMITTED.labels(card.name, tenant.name).inc()
        if failure is not None:
            failure.extra["job_id"] = str(record["id"])
            raise failure
        assert outputs is not None
        return Answer(card, outputs, record["id"])
