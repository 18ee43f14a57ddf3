"""Async jobs of a tenant: submit (one or many), read, list, wait for, cancel, and
follow their events. Submits go through the one submission path; reads open no
unit of work; cancels are one each."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy.orm import Session, undefer

from app.cards import ModelCard
from app.errors import Conflict, DomainError, NotFound
from app.jobs import outputs, reads, transitions
from app.jobs.events import EventBus, events_after
from app.jobs.outputs import OUTPUT
from app.jobs.reads import Page, Waiter
from app.jobs.representation import JobSchema
from app.jobs.staging import deadline
from app.jobs.tables import Job, JobEvent
from app.operations.holds import Holds
from app.operations.requests import JobQuery, JobRequest, Wait
from app.operations.submission import Submitter
from app.platform.database import Database, transactional
from app.repository.registry import CardCache
from app.statuses import TERMINAL, JobStatus
from app.tenancy.keys import TenantRef

__all__ = [
    "OUTPUT",
    "Job",
    "JobEvent",
    "JobOperations",
    "JobSchema",
    "Page",
    "deadline",
]

T = TypeVar("T")


class JobOperations:
    def __init__(
        self,
        database: Database,
        submitter: Submitter,
        holds: Holds,
        events: EventBus,
        journaled: Callable[[uuid.UUID, int], bool] | None = None,
    ) -> None:
        """`journaled(job_id, tenant_id)`: writes a sync call's record still in the
        journal now (app.sync.records.RecordWriter.write_now); whether there was one."""
        self.database, self._submitter, self._holds = database, submitter, holds
        self._waiter = Waiter(events, database.end_reads)
        self._journaled = journaled

    def _found(self, tenant: TenantRef, job_id: uuid.UUID, read: Callable[[], T]) -> T:
        """`read()`, once more after writing the job's record if it was still in the
        journal: a sync call's id is readable as soon as its caller has it, though
        its record is written behind."""
        try:
            return read()
        except NotFound:
            if self._journaled is None:
                raise
            # Written now if it waits in the journal; if it is not there, its writer may
            # have written it since the read (and taken it out): either way, read again.
            self._journaled(job_id, tenant.id)
        self.database.end_reads()  # a fresh snapshot: the record was committed since
        return read()

    def submit(self, tenant: TenantRef, request: JobRequest, card: ModelCard | None = None) -> Job:
        """Check the inputs against the model, store the job, then wake its workers.

        The row is committed before its model's workers are woken, so a claim
        always sees it; if the wake-up fails, the job stays queued and the sweep
        wakes them. With an idempotency key, a repeat of the same request returns
        the first job. The tenant sees only the models its card grants. `card`:
        the request's, where the door resolved it already.
        """
        if card is None:
            card = self._submitter.card(tenant, request.model, request.version)
        return self._submitter.submit(tenant, card, request)

    def submit_many(
        self,
        tenant: TenantRef,
        requests: Sequence[JobRequest],
        *,
        staged: Callable[[Session, list[Job]], object] | None = None,
        key_field: str = "idempotency_key",
        cards: CardCache | None = None,
    ) -> list[Job | DomainError]:
        """Many jobs at once, in request order, each its job or its own error; a door's
        own rows (`staged`) beside them in their transaction (`Submitter.submit_many`);
        `cards`: those the door resolved already."""
        return self._submitter.submit_many(tenant, requests, staged=staged, key_field=key_field,
                                           cards=cards)  # fmt: skip

    def get(self, tenant: TenantRef, job_id: uuid.UUID) -> Job:
        """The tenant's job with its outputs; another tenant's is NotFound."""
        job = self._found(tenant, job_id, lambda: reads.get(self.database.session(), tenant.id,
                                                             job_id))  # fmt: skip
        return self._so_far(job)

    def wait(self, tenant: TenantRef, job_id: uuid.UUID, wait: Wait) -> Job:
        """The job after waiting (holding one of the tenant's waits) for its next
        change or its end, or as it stands when the time is up."""
        if wait.seconds <= 0:
            return self.get(tenant, job_id)
        session = self.database.session()
        wait_for = reads.wait_for_change if wait.until == "change" else reads.wait_until_finished
        with self._holds.holding(tenant.id):
            job = self._found(tenant, job_id, lambda: wait_for(
                session, self._waiter, tenant.id, job_id, wait.seconds))  # fmt: skip
        return self._so_far(job)

    def _so_far(self, job: Job) -> Job:
        """A running generation shows the text recorded so far as its outputs."""
        if job.status == JobStatus.RUNNING and job.output_data is None:
            text = outputs.text_so_far(self.database.session(), job.id)
            if text is not None:
                # a plain attribute, not a column: the session never writes it back
                setattr(job, "so_far", {"text": text})  # noqa: B010
        return job

    def list_jobs(self, tenant: TenantRef, query: JobQuery) -> Page:
        return reads.list_jobs(
            self.database.session(), tenant.id, limit=query.limit, status=query.status,
            model=query.model, cursor=query.cursor, outputs=query.outputs,
        )  # fmt: skip

    @transactional
    def cancel(self, tenant: TenantRef, job_id: uuid.UUID) -> Job:
        """Cancel a queued job at once; a running one stops at its next checkpoint
        (before its result is written). A finished job cannot be cancelled: Conflict."""
        session = self.database.session()
        status = transitions.request_cancel(session, tenant.id, job_id)
        job = reads.get(session, tenant.id, job_id)
        if status is None:
            raise Conflict(
                f"job {job_id} is already {job.status}; only queued or running jobs can be "
                "cancelled",
                job_status=job.status,
            )
        session.refresh(job)
        return job

    @transactional
    def cancel_many(self, tenant: TenantRef, job_ids: list[uuid.UUID]) -> int:
        """Cancel those of the tenant's jobs that are still unfinished (a caller that
        went away): queued ones at once, running ones at their next checkpoint.
        Finished and unknown ones are left as they are. Returns how many were."""
        if not job_ids:
            return 0
        return transitions.request_cancel_many(self.database.session(), tenant.id, job_ids)

    def follow(self, tenant: TenantRef, job_id: uuid.UUID, after: int) -> Callable[[], None] | None:
        """Before a job's event stream: NotFound for another tenant's job, None when
        a stream resumed after event `after` has nothing left to send (the job
        finished and its terminal event was sent); otherwise one of the tenant's
        waits, held until the returned release is called (when the stream ends)."""
        self._found(tenant, job_id, lambda: reads.get(self.database.session(), tenant.id, job_id))
        due = reads.events_due(self.database.session(), job_id, after)
        self.database.end_reads()  # the stream reads in sessions of its own
        return self._holds.acquire(tenant.id) if due else None

    def events(self, job_id: uuid.UUID, after: int) -> tuple[list[JobEvent], Job | None]:
        """The job's events after event `after`, and, once one of them is terminal,
        the job as it ended; read in a session of its own, closed before the caller
        (a slow client) takes them."""
        with self.database.sessionmaker() as session:
            found = events_after(session, job_id, after)
            if not any(event.status in TERMINAL for event in found):
                return found, None
            return found, session.get(Job, job_id, options=[undefer(Job.output_data)])

    def watching(self) -> EventBus:
        """The bus that says when a job changed (for a door that streams its events)."""
        return self._waiter.bus
