"""The path every new job takes, whichever door it came in by: its inputs checked
against its model's card, admitted against the tenant's quotas and the model's
queue bound (a refusal keeps nothing), its row written, and, once committed, its
model's workers woken. The jobs, calls and bindings operations all submit here.

Rows with nothing to write beside them go in the process's coalesced INSERT
(app.jobs.inserts: many submits, one statement and one commit); rows that need
company in their transaction (an idempotency key, a door's own rows) are staged
in the caller's unit of work, and their wake-up waits for its commit.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.cards import ModelCard
from app.errors import DomainError
from app.execution.dispatch import Dispatcher
from app.jobs import idempotency, reads, staging, transitions
from app.jobs.admission import Admission
from app.jobs.idempotency import BulkKeys, Checked
from app.jobs.inserts import JobInserter
from app.jobs.staging import Terms
from app.jobs.tables import Job
from app.observability import metrics, tracing
from app.operations.requests import JobRequest
from app.platform.database import Database, transactional
from app.repository.registry import CardCache, ModelRepository
from app.tenancy.keys import TenantRef
from app.tenancy.quotas import Limits, Quotas
from app.webhooks.ssrf import UrlPolicy

T = TypeVar("T")
Outcomes = list[Job | DomainError | None]


@dataclass(frozen=True)
class SubmitSettings:
    """What submitting needs of the settings: JOB_MAX_ATTEMPTS, and which webhook
    URLs a job may name (WEBHOOK_ALLOW_PRIVATE_NETWORKS, WEBHOOK_ALLOWED_NETWORKS)."""

    max_attempts: int
    webhooks: UrlPolicy


class Submitter:
    def __init__(
        self,
        database: Database,
        repository: ModelRepository,
        inserter: JobInserter,
        dispatcher: Dispatcher,
        admission: Admission,
        quotas: Quotas,
        settings: SubmitSettings,
    ) -> None:
        self.database, self.repository, self.settings = database, repository, settings
        self._inserter, self._dispatcher = inserter, dispatcher
        self._admission, self._quotas = admission, quotas

    def card(self, tenant: TenantRef, model: str, version: str | None) -> ModelCard:
        """The card of the model the tenant names (UnknownModel, or not theirs)."""
        return self.repository.resolve(model, version, tenant.name)

    def cards(self, tenant: TenantRef) -> CardCache:
        """The cards the tenant may use, each looked up once for a batch of requests."""
        return CardCache(self.repository, tenant.name)

    def terms(self, request: JobRequest) -> Terms:
        return Terms(request.priority, request.deadline, request.webhook,
                     self.settings.max_attempts, request.reply_to, request.traceparent)  # fmt: skip

    def check(self, card: ModelCard, request: JobRequest) -> dict[str, Any]:
        """The request's inputs as the card's arrays (InputsDoNotFit), its webhook's
        URL one the service may call (InvalidRequest)."""
        arrays = staging.check_inputs(card, request.inputs, request.parameters)
        if request.webhook is not None:
            self.settings.webhooks.check(request.webhook.url)
        if request.record is not None:
            arrays[staging.RECORD] = staging.record_array(request.record)
        return arrays

    def submit(self, tenant: TenantRef, card: ModelCard, request: JobRequest) -> Job:
        """One job. With an idempotency key, a repeat of the same request returns the
        first job (the key is held under an advisory lock until the commit). Its
        admission is a span of the request's trace, which the job's spans join."""
        with tracing.span("admission", request.traceparent, model=card.name) as traced:
            return self._submit(tenant, card, replace(request, traceparent=traced))

    def _submit(self, tenant: TenantRef, card: ModelCard, request: JobRequest) -> Job:
        arrays = self.check(card, request)
        if request.idempotency_key is not None:
            job, new = self._submit_keyed(tenant, card, request, arrays)
        else:
            self._admit_one(tenant, card, request)
            values = staging.job_values(card, arrays, tenant.id, self.terms(request))
            self.database.end_reads()  # the admission's reads: the writer's wait holds none
            # Committed together with concurrent submits, its model woken (app.jobs.inserts).
            job, new = Job(**values, **self._inserter.insert(values)), True
        if new:
            metrics.JOBS_SUBMITTED.labels(card.name, tenant.name).inc()
        return job

    def _admit_one(self, tenant: TenantRef, card: ModelCard, request: JobRequest) -> None:
        """Refusals keep nothing: QuotaExceeded names the limit, QueueFull the bound."""
        session = self.database.session()
        self._quotas.admit_jobs(session, tenant.id, priority=request.priority)
        if card.generation is not None:
            self._quotas.admit_tokens(session, tenant.id)
        self._admission.admit(session, card.name)

    @transactional
    def _submit_keyed(
        self, tenant: TenantRef, card: ModelCard, request: JobRequest, arrays: dict[str, Any]
    ) -> tuple[Job, bool]:
        """The job the key made before (False), or a new one staged with the key in
        this transaction (True), its wake-up after the commit."""
        session, key = self.database.session(), request.idempotency_key
        assert key is not None
        request_hash = staging.fingerprint(
            request.model, request.version, request.inputs, request.parameters
        )
        earlier = idempotency.claim(session, tenant.id, key, request_hash)
        if earlier is not None:
            return reads.get(session, tenant.id, earlier), False
        self._admit_one(tenant, card, request)
        values = staging.job_values(card, arrays, tenant.id, self.terms(request))
        job = staging.stage(session, values)
        idempotency.remember(session, tenant.id, key, request_hash, job.id)
        self.wake_once_committed(job.model, [job.id])
        return job, True

    def submit_many(
        self,
        tenant: TenantRef,
        requests: Sequence[JobRequest],
        *,
        staged: Callable[[Session, list[Job]], object] | None = None,
        key_field: str = "idempotency_key",
        cards: CardCache | None = None,
    ) -> list[Job | DomainError]:
        """Many jobs at once, in request order: each checked on its own (a bad one is
        its own error in the list; the others go on), then one quota count for all
        of a priority, one queue-bound count per model, one INSERT, one commit and
        one wake-up per model. A request with an idempotency key gets the job its key
        made before; a key repeated in the list gets its first use's outcome.
        `staged` runs in the transaction, after the jobs are written: a door's own
        rows beside them. `key_field` names the key in errors (the door's name)."""
        with tracing.spans("admission", [r.traceparent for r in requests]) as traced:
            requests = [replace(r, traceparent=t) if t != r.traceparent else r
                        for r, t in zip(requests, traced, strict=True)]  # fmt: skip
            return self._submit_many(tenant, requests, staged, key_field,
                                     cards or self.cards(tenant))  # fmt: skip

    def _submit_many(
        self,
        tenant: TenantRef,
        requests: Sequence[JobRequest],
        staged: Callable[[Session, list[Job]], object] | None,
        key_field: str,
        cards: CardCache,
    ) -> list[Job | DomainError]:
        outcomes: Outcomes = [None] * len(requests)
        checked: list[Checked] = []
        for index, request in enumerate(requests):
            try:
                card = cards(request.model, request.version)
                checked.append((index, card, self.check(card, request)))
            except DomainError as exc:
                outcomes[index] = exc
        if checked:
            keys = BulkKeys(requests, checked, key_field)
            if keys.none and staged is None:
                self._insert_many(tenant, requests, checked, outcomes)
            else:
                self._stage_many(tenant, requests, keys, outcomes, staged)
            keys.repeat(outcomes)
        done = [outcome for outcome in outcomes if outcome is not None]
        assert len(done) == len(requests), "each request has its job or its error"
        return done

    def _insert_many(
        self, tenant: TenantRef, requests: Sequence[JobRequest], checked: list[Checked],
        outcomes: Outcomes,
    ) -> None:  # fmt: skip
        """Nothing else to write with them: the rows go in the process's coalesced
        INSERT, all in one statement, their models woken. The admission reads'
        transaction ends first: the wait holds none."""
        admitted = self._admitted(requests, checked, outcomes, tenant)
        self.database.end_reads()
        if not admitted:
            return
        values = [staging.job_values(card, arrays, tenant.id, self.terms(requests[index]))
                  for index, card, arrays in admitted]  # fmt: skip
        written = self._inserter.insert_many(values)
        jobs = [Job(**v, **d) for v, d in zip(values, written, strict=True)]
        self._placed(tenant, [index for index, _, _ in admitted], jobs, outcomes)

    @transactional
    def _stage_many(
        self,
        tenant: TenantRef,
        requests: Sequence[JobRequest],
        keys: BulkKeys,
        outcomes: Outcomes,
        staged: Callable[[Session, list[Job]], object] | None,
    ) -> None:
        """The rows staged in this unit of work with their keys (held until it
        commits) and the door's own rows; each model woken after the commit."""
        session = self.database.session()
        admitted = self._admitted(
            requests, keys.claim(session, tenant.id, outcomes), outcomes, tenant
        )
        if not admitted:
            return
        values = [staging.job_values(card, arrays, tenant.id, self.terms(requests[index]))
                  for index, card, arrays in admitted]  # fmt: skip
        order = [index for index, _, _ in admitted]
        jobs = staging.stage_many(session, values)
        keys.remember(session, tenant.id, order, jobs)
        if staged is not None:
            staged(session, jobs)
        for woken in grouped(jobs, lambda job: job.model):
            self.wake_once_committed(woken[0].model, [job.id for job in woken])
        self._placed(tenant, order, jobs, outcomes)

    @staticmethod
    def _placed(tenant: TenantRef, order: list[int], jobs: list[Job], outcomes: Outcomes) -> None:
        for index, job in zip(order, jobs, strict=True):
            outcomes[index] = job
            metrics.JOBS_SUBMITTED.labels(job.model, tenant.name).inc()

    def _admitted(
        self,
        requests: Sequence[JobRequest],
        checked: list[Checked],
        outcomes: Outcomes,
        tenant: TenantRef,
    ) -> list[Checked]:
        """Those of `checked` the tenant's quotas (per priority) and each model's queue
        bound admit, grouped by model; each refused group gets its refusal."""
        session = self.database.session()
        if any(card.generation is not None for _, card, _ in checked):
            try:  # (a generation of a tenant whose token budget is spent)
                self._quotas.admit_tokens(session, tenant.id)
            except DomainError as exc:
                for index, card, _ in checked:
                    if card.generation is not None:
                        outcomes[index] = exc
                checked = [item for item in checked if item[1].generation is None]
        admitted: list[Checked] = []
        for group in grouped(checked, lambda item: requests[item[0]].priority):
            try:
                priority, count = requests[group[0][0]].priority, len(group)
                self._quotas.admit_jobs(
                    session, tenant.id, count, priority=priority, requests=count
                )
                admitted += group
            except DomainError as exc:
                for index, _, _ in group:
                    outcomes[index] = exc
        kept: list[Checked] = []
        for group in grouped(admitted, lambda item: item[1].name):
            try:
                self._admission.admit(session, group[0][1].name, len(group))
                kept += group
            except DomainError as exc:
                for index, _, _ in group:
                    outcomes[index] = exc
        return kept

    def limits(self, tenant: TenantRef) -> Limits:
        """The tenant's quotas, to check each of many requests' priority by."""
        return self._quotas.limits(self.database.session(), tenant.id)

    def admit(self, tenant: TenantRef, by_model: Counter[str]) -> None:
        """Admit these many jobs of each model together (one request each, as a door
        that reads many callers' requests at once counts them), or raise
        QuotaExceeded or QueueFull for all of them."""
        session, total = self.database.session(), sum(by_model.values())
        self._quotas.admit_jobs(session, tenant.id, total, requests=total)
        for model, count in by_model.items():
            self._admission.admit(session, model, count)

    def admit_calls(self, tenant: TenantRef, calls: int = 1) -> None:
        """Sync calls that run inline or on the sync lane: counted against the
        tenant's rate, never in flight (its waits bound them: MAX_WAITS_PER_TENANT)."""
        self._quotas.admit_jobs(self.database.session(), tenant.id, 0, requests=calls)

    def wake_once_committed(self, model: str, job_ids: list[uuid.UUID]) -> None:
        """Once the unit of work committed, wake `model`'s workers for these jobs."""
        self.database.once_committed(lambda: self.wake(model, job_ids))

    def wake(self, model: str, job_ids: list[uuid.UUID]) -> None:
        """Wake the model for these committed jobs, or leave them to the sweep (its
        wake-up could not be sent: they are marked unsent)."""
        if job_ids and not self._dispatcher.wake(model):
            self._mark_unsent(job_ids)

    @transactional
    def _mark_unsent(self, job_ids: list[uuid.UUID]) -> None:
        transitions.mark_unsent(self.database.session(), job_ids)


def grouped(items: list[T], key: Callable[[T], Any]) -> list[list[T]]:
    """`items` in groups of equal `key`, each group in the order its items came."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())
