"""Sync calls: a caller waits for a model's outputs, within a deadline.

A call of a worker-run model travels the sync lane (app.sync.lane): pushed onto
its model's Redis list, taken by a worker into a micro-batch, answered over this
process's reply channel (app.sync.replies), its record journaled in the same
step and written behind (app.sync.records). A card with `"execution": "inline"`
runs here instead, through the same inference function, its record journaled
before the caller is answered. A generative model's call (and every call with
SYNC_LANE off) is an ordinary job, ahead of every async job of its model. The
HTTP and gRPC doors call these; a gRPC stream follows many calls at once.
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
from app.errors import (
    CallerLeft,
    DomainError,
    InferenceFailed,
    QueueFull,
    Unavailable,
    UnknownModel,
)
from app.execution import runs
from app.jobs import staging
from app.jobs.tables import SYNC_PRIORITY
from app.observability import metrics
from app.operations.holds import Holds
from app.operations.jobs import JobOperations
from app.operations.requests import InferRequest, JobRequest
from app.operations.submission import Submitter
from app.platform.database import Database
from app.repository.registry import ModelRepository
from app.runtime.sessions import SessionPool
from app.runtime.tensors import pack
from app.sync import lane
from app.sync.calls import TEXT_OUTPUT, Answer, Call, Calls, ended_without_outputs
from app.sync.records import RecordWriter
from app.sync.recovery import Recovery
from app.sync.replies import Replies
from app.tenancy.keys import TenantRef

__all__ = [
    "TEXT_OUTPUT", "Answer", "Call", "CallOperations", "CallSettings", "Calls",
    "ended_without_outputs",
]  # fmt: skip


@dataclass(frozen=True)
class CallSettings:
    """How long a caller waits: SYNC_TIMEOUT_SECONDS unless the call says, never
    more than MAX_WAIT_SECONDS; and whether worker-run models' calls travel the
    sync lane (SYNC_LANE)."""

    timeout_s: float
    max_wait_s: float
    lane: bool = True


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
        lane_: LaneCalls,
    ) -> None:
        self.database, self._submitter, self._jobs = database, submitter, jobs
        self._holds, self._replies, self._inline = holds, replies, inline
        self.settings, self._lane = settings, lane_

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
            self.cancel(tenant, [call])
            raise CallerLeft(f"the caller left before job {call.job_id} finished; cancelled")

    def start_call(self, tenant: TenantRef, request: InferRequest) -> Call:
        """Check a sync call and submit its job, ahead of every async job of its
        model, without waiting for it (an inline model runs now: the call comes
        back done). For a door that follows many calls at once (`follow_calls`)."""
        card = self._submitter.card(tenant, request.model, request.version)
        timeout_s = self._timeout(request)
        now = time.monotonic()
        give_up_at = now + timeout_s
        route = self.route(card)
        if route == lane.INLINE:
            arrays = staging.check_inputs(card, request.inputs)
            self._submitter.admit_calls(tenant)
            self.database.end_reads()  # the admission's reads: the run holds no connection
            done = self._inline.run(tenant, card, arrays)
            return Call(card, done.job_id, timeout_s, give_up_at, done)
        if route == lane.LANE:
            arrays = staging.check_inputs(card, request.inputs)
            self._submitter.admit_calls(tenant)
            self.database.end_reads()
            [call] = self._lane.send(tenant, [(card, arrays, timeout_s, request)], now)
            if isinstance(call, DomainError):
                raise call
            return call
        self._lane.check_served(card)
        job = self._submitter.submit(tenant, card, self._job(card, request))  # holds no reads
        return Call(card, job.id, timeout_s, give_up_at)

    def route(self, card: ModelCard) -> str:
        """How a sync call of `card` travels (app.sync.lane.route)."""
        return lane.route(card, self.settings.lane)

    def start_calls(
        self, tenant: TenantRef, requests: Sequence[InferRequest]
    ) -> list[Call | DomainError]:
        """`start_call` for many calls at once (a stream's requests that arrived
        together): their jobs in one `submit_many`, each call's error its own."""
        now = time.monotonic()
        started: list[Call | DomainError | None] = [None] * len(requests)
        queued: list[tuple[int, ModelCard, float]] = []
        jobs: list[JobRequest] = []
        on_lane: list[tuple[int, tuple[ModelCard, Any, float, InferRequest]]] = []
        cards = self._submitter.cards(tenant)
        for index, request in enumerate(requests):
            try:
                card = cards(request.model, request.version)
                route = self.route(card)
                if route == lane.INLINE:
                    started[index] = self.start_call(tenant, request)
                    continue
                if route == lane.LANE:
                    arrays = staging.check_inputs(card, request.inputs)
                    on_lane.append((index, (card, arrays, self._timeout(request), request)))
                    continue
                self._lane.check_served(card)
            except DomainError as exc:
                started[index] = exc
                continue
            queued.append((index, card, self._timeout(request)))
            jobs.append(self._job(card, request))
        if on_lane:
            try:
                self._submitter.admit_calls(tenant, len(on_lane))
                self.database.end_reads()
                sent = self._lane.send(tenant, [call for _, call in on_lane], now)
            except DomainError as exc:
                sent = [exc] * len(on_lane)
            for (index, _), call in zip(on_lane, sent, strict=True):
                started[index] = call
        submitted = self._submitter.submit_many(tenant, jobs) if jobs else []
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
        return Calls(self.database.engine, self._replies.follow(), tenant.id, gather_s, self._lane)

    def hold(self, tenant: TenantRef) -> Callable[[], None]:
        """One of the tenant's waits, for a door that keeps a caller waiting for
        long (a gRPC stream); TooManyWaits beyond its share. Returns its release."""
        return self._holds.acquire(tenant.id)

    def cancel(self, tenant: TenantRef, calls: list[Call]) -> int:
        """Cancel the calls whose caller went away: a job's, if unfinished; a lane
        call's, if no worker took it yet (one taken runs, and is recorded)."""
        on_lane = [call for call in calls if call.lane_entry is not None]
        if on_lane:
            self._lane.withdraw_all(on_lane)
        job_ids = [call.job_id for call in calls if call.lane_entry is None and call.job_id]
        return self._jobs.cancel_many(tenant, job_ids) if job_ids else 0

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
            traceparent=request.traceparent,
        )  # fmt: skip


class LaneCalls:
    """This process's side of the sync lane: push calls onto their queues' lanes,
    refuse at once those no live worker can take, withdraw those whose caller
    stopped waiting, and now and then settle dead workers' calls."""

    RECOVER_EVERY_S = 1.0

    def __init__(
        self, lane_: lane.Lane, recovery: Recovery, replies: Replies,
        queue_for: Callable[[str], str],
    ) -> None:  # fmt: skip
        """`queue_for`: a model's queue (app.execution.dispatch.Dispatcher.queue_for)."""
        self._lane, self._recovery, self._replies = lane_, recovery, replies
        self._queue_for = queue_for
        self._recovered_at = 0.0

    def send(
        self,
        tenant: TenantRef,
        calls: Sequence[tuple[ModelCard, Any, float, InferRequest]],
        now: float,
    ) -> list[Call | DomainError]:
        """Push checked calls (card, arrays, timeout, request) onto their queues'
        lanes; a queue's calls all go, or are all refused: Unavailable when no
        worker serves the queue, QueueFull when its lane is at its bound."""
        if not self._replies.listening():
            raise Unavailable("this process cannot hear answers (Redis?); retry shortly",
                              retry_after=1)  # fmt: skip
        sent_at = time.time()
        started: list[Call | DomainError] = []
        by_queue: dict[str, list[int]] = {}
        for card, arrays, timeout_s, request in calls:
            deadline = sent_at + timeout_s
            if request.deadline is not None:
                deadline = min(deadline, request.deadline.timestamp())
            queue = self._queue_for(card.name)
            entry = lane.Entry(
                uuid.uuid4(), tenant.id, card.name, card.version, queue, self._replies.channel,
                sent_at, deadline, pack(arrays), lane.batch_limit(card), lane.idempotent(card),
                traceparent=request.traceparent,
            )  # fmt: skip
            by_queue.setdefault(queue, []).append(len(started))
            started.append(Call(card, entry.id, timeout_s, now + timeout_s,
                                lane_entry=lane.encode(entry), lane_queue=queue))  # fmt: skip
        for queue, indexes in by_queue.items():
            entries = [started[i].lane_entry for i in indexes]  # type: ignore[union-attr]
            pushed = self._lane.push(queue, entries)  # type: ignore[arg-type]
            if pushed >= 0:
                for i in indexes:
                    metrics.JOBS_SUBMITTED.labels(started[i].card.name, tenant.name).inc()  # type: ignore[union-attr]
                continue
            models = sorted({started[i].card.ref for i in indexes})  # type: ignore[union-attr]
            refusal = (
                self._unserved(queue, models) if pushed == lane.NOT_SERVED
                else QueueFull(
                    f"the sync lane of queue {queue} (model {', '.join(models)}) holds "
                    f"{self._lane.bound} calls waiting for a worker (SYNC_LANE_MAX_WAITING); "
                    "nothing was kept: retry shortly",
                    retry_after=1, model=models[0], queue=queue,
                )
            )  # fmt: skip
            for i in indexes:
                started[i] = refusal
        return started

    def check_served(self, card: ModelCard) -> None:
        """Unavailable, at once, when no live worker serves `card`'s queue (a call
        that would otherwise wait its whole timeout for a worker that cannot come)."""
        queue = self._queue_for(card.name)
        if not self._lane.served(queue):
            raise self._unserved(queue, [card.ref])

    def _unserved(self, queue: str, models: list[str]) -> Unavailable:
        return Unavailable(
            f"no live worker serves queue {queue!r} of model {', '.join(models)} now, so "
            "nothing would answer this call; nothing was kept: retry shortly, or start a "
            f"worker for the queue (WORKER_QUEUES={queue})",
            retry_after=1, model=models[0], queue=queue,
        )  # fmt: skip

    def withdraw(self, call: Call) -> bool:
        assert call.lane_entry is not None and call.lane_queue is not None
        return self._lane.withdraw(call.lane_queue, call.lane_entry)

    def withdraw_all(self, calls: list[Call]) -> None:
        for call in calls:
            self.withdraw(call)

    def recover(self) -> None:
        now = time.monotonic()
        if now - self._recovered_at < self.RECOVER_EVERY_S:
            return
        self._recovered_at = now
        self._recovery.run()


class InlineRuns:
    """Calls of inline models, run in this process; each leaves its job record
    (succeeded or failed), journaled before the caller is answered and written
    behind (app.sync.records): the call is in GET /jobs/<id> and /usage like any
    job, a moment after its answer."""

    def __init__(
        self, sessions: Callable[[], SessionPool], records: RecordWriter,
        repository: ModelRepository,
    ) -> None:  # fmt: skip
        self._sessions, self._records, self._repository = sessions, records, repository

    def run(self, tenant: TenantRef, card: ModelCard, arrays: dict[str, Any]) -> Answer:
        started_at = datetime.now(UTC)
        [outcome] = runs.run_card(self._sessions(), card, [arrays], self._repository)
        outputs, error, compute_s = runs.result(outcome)
        record = staging.call_record(
            (card.name, card.version), staging.batch_rows(card, arrays), tenant.id, started_at,
            compute_s, outputs=outputs, error=error,
        )  # fmt: skip
        self._records.journal([record])
        metrics.JOBS_SUBMITTED.labels(card.name, tenant.name).inc()
        if error is not None:
            code, detail = error
            if code == runs.MODEL_UNAVAILABLE:  # removed a moment ago: as for a call made now
                raise UnknownModel(card.name, card.version, [], detail)
            raise InferenceFailed(detail, error_code=code, job_id=str(record["id"]))
        assert outputs is not None
        return Answer(card, outputs, record["id"])
