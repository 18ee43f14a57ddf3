"""Stream bindings and the log door: a tenant's bindings (a model between an input
log and an output log), the consumers' batches of entries turned into jobs, and
the publishers' outbox of results. Each is one unit of work; the purge of old
entries' records is one per piece."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.bindings import definitions, entries
from app.bindings.definitions import ActiveBinding
from app.bindings.entries import EntryOutcome, Finished
from app.bindings.representation import BindingSchema
from app.bindings.tables import StreamBinding
from app.cards import ModelCard
from app.errors import DomainError
from app.jobs import staging
from app.jobs.inserts import INSERT_JOBS
from app.jobs.staging import Terms
from app.observability import metrics
from app.operations.requests import BindingFields, EntryRequest
from app.operations.submission import Submitter
from app.platform.database import Database, transactional
from app.repository.registry import CardCache
from app.tenancy.keys import TenantRef
from app.tenancy.quotas import check_priority

__all__ = [
    "ActiveBinding",
    "BindingOperations",
    "BindingSchema",
    "BindingSettings",
    "EntryOutcome",
    "Finished",
    "StreamBinding",
]

PURGE_PIECE = 5000  # stream entries' records deleted a transaction


@dataclass(frozen=True)
class BindingSettings:
    """STREAMS_PREFIX (under which a tenant's logs are named) and RETENTION_SECONDS
    (how long published entries' records are kept; 0: for ever)."""

    prefix: str
    retention_s: float


class BindingOperations:
    def __init__(self, database: Database, submitter: Submitter, settings: BindingSettings) -> None:
        self.database, self._submitter, self.settings = database, submitter, settings

    # -- a tenant's bindings -------------------------------------------------------

    @transactional
    def create(self, tenant: TenantRef, fields: BindingFields) -> StreamBinding:
        """Bind a model to an input and an output log under the tenant's prefix;
        consumers start reading it within STREAMS_REFRESH_SECONDS."""
        return definitions.create(
            self.database.session(), self._submitter.repository, self.settings.prefix, tenant,
            dict(fields),
        )  # fmt: skip

    @transactional
    def update(
        self, tenant: TenantRef, binding_id: uuid.UUID, changes: BindingFields
    ) -> StreamBinding:
        return definitions.update(
            self.database.session(), self._submitter.repository, self.settings.prefix, tenant,
            binding_id, dict(changes),
        )  # fmt: skip

    @transactional
    def delete(self, tenant: TenantRef, binding_id: uuid.UUID) -> None:
        """Its jobs stay; its logs and consumer group stay too (they are the tenant's)."""
        definitions.delete(self.database.session(), tenant.id, binding_id)

    def get(self, tenant: TenantRef, binding_id: uuid.UUID) -> StreamBinding:
        return definitions.get(self.database.session(), tenant.id, binding_id)

    def list_bindings(self, tenant: TenantRef) -> list[StreamBinding]:
        return definitions.list_bindings(self.database.session(), tenant.id)

    def find(self, tenant: TenantRef, which: str) -> uuid.UUID | None:
        """A binding by its id, or by its input log (short or full name)."""
        try:
            return uuid.UUID(which)
        except ValueError:
            pass
        for binding in self.list_bindings(tenant):
            if which in (binding.input, binding.input.rsplit(":", 1)[-1]):
                return binding.id
        return None

    # -- the stream door's consumers and publishers --------------------------------

    def active(self) -> list[ActiveBinding]:
        """Every unpaused binding, for the stream consumers."""
        found = definitions.active(self.database.session())
        self.database.end_reads()  # a consumer's scope lasts: its reads hold nothing
        return found

    def accept_entries(
        self,
        binding: ActiveBinding,
        requests: Sequence[EntryRequest],
        *,
        find_redelivered: bool = True,
    ) -> list[EntryOutcome]:
        """Turn a batch of input entries into jobs, in one transaction; what became
        of each, in order.

        An entry that already made a job (a redelivery) gets that job back; one
        whose model is unknown or whose inputs do not fit gets its error (a dead
        letter for the door) and the others go on. The new jobs are admitted
        together against the tenant's quotas and each model's queue bound: when
        full, QuotaExceeded or QueueFull for the whole batch and nothing is kept,
        so the door leaves the entries unacknowledged and reads again after
        `retry_after`. The jobs go in with one multi-row INSERT beside their
        entries' records, then each model's workers are woken once: ordinary
        jobs, micro-batched by the workers like any others. `find_redelivered`
        is the guard the fault suite turns off.
        """
        outcomes, made = self._accept(binding, requests, find_redelivered)
        for model, count in made.items():
            metrics.JOBS_SUBMITTED.labels(model, binding.tenant.name).inc(count)
        return outcomes

    @transactional
    def _accept(
        self, binding: ActiveBinding, requests: Sequence[EntryRequest], find_redelivered: bool
    ) -> tuple[list[EntryOutcome], Counter[str]]:
        session, tenant = self.database.session(), binding.tenant
        ids = [request.entry_id for request in requests]
        known = entries.accepted(session, binding.id, ids) if find_redelivered else {}
        outcomes: dict[str, EntryOutcome] = {
            entry_id: EntryOutcome(entry_id, job_id, redelivered=True)
            for entry_id, job_id in known.items()
        }
        staged = self._staged(binding, [r for r in requests if r.entry_id not in known], outcomes)
        by_model = Counter(values["model"] for _, values in staged)
        if staged:  # refusals keep nothing: QuotaExceeded names the limit, QueueFull the bound
            self._submitter.admit(tenant, by_model)
        rows = [(r.entry_id, r.request_id, values["id"]) for r, values in staged]
        new = entries.record(session, binding.id, rows)
        made = [values for r, values in staged if r.entry_id in new or not find_redelivered]
        if made:
            session.connection().execute(INSERT_JOBS, made)
        for request, values in staged:
            if request.entry_id in new:
                outcomes[request.entry_id] = EntryOutcome(request.entry_id, values["id"])
        raced = [r.entry_id for r, _ in staged if r.entry_id not in new]
        for entry_id, job_id in entries.accepted(session, binding.id, raced).items():
            outcomes[entry_id] = EntryOutcome(entry_id, job_id, redelivered=True)
        woken: Counter[str] = Counter()
        for model in by_model:
            job_ids = [values["id"] for values in made if values["model"] == model]
            self._submitter.wake_once_committed(model, job_ids)
            woken[model] = len(job_ids)
        return [outcomes[entry_id] for entry_id in ids], woken

    def _staged(
        self,
        binding: ActiveBinding,
        requests: Sequence[EntryRequest],
        outcomes: dict[str, EntryOutcome],
    ) -> list[tuple[EntryRequest, dict[str, Any]]]:
        """Each new entry's job columns, or (its own fault: a dead letter) its error."""
        tenant = binding.tenant
        limits = self._submitter.limits(tenant)
        cards = self._submitter.cards(tenant)
        max_attempts = self._submitter.settings.max_attempts
        staged: list[tuple[EntryRequest, dict[str, Any]]] = []
        for request in requests:
            try:
                card = _entry_card(binding, request, cards)
                arrays = staging.check_inputs(card, request.inputs, request.parameters)
                check_priority(request.priority, limits)
            except DomainError as exc:
                outcomes[request.entry_id] = EntryOutcome(request.entry_id, error=exc)
                continue
            terms = Terms(request.priority, max_attempts=max_attempts,
                          traceparent=request.traceparent)  # fmt: skip
            staged.append((request, staging.job_values(card, arrays, tenant.id, terms)))
        return staged

    @transactional
    def publish_results(
        self,
        send: Callable[[list[Finished]], None],
        *,
        job_ids: Sequence[uuid.UUID] | None = None,
        limit: int = 512,
    ) -> list[Finished]:
        """The outbox of the stream door: take up to `limit` entries whose job ended
        and whose result is not yet in its output log (of `job_ids` only, when
        given), locked so no other publisher takes them; `send` appends their
        output entries; then they are marked published, in the same transaction.
        If `send` raises, nothing is marked and the next call takes them again."""
        session = self.database.session()
        done = entries.finished(session, limit, job_ids)
        if done:
            send(done)
            entries.mark_published(session, [item.job_id for item in done])
        return done

    def purge_entries(self) -> int:
        """Delete published entries' records older than RETENTION_SECONDS (none when
        0), a piece of PURGE_PIECE rows a unit of work (a day of a busy log is
        millions of rows), until none is left."""
        if self.settings.retention_s <= 0:
            return 0
        total = 0
        while True:
            deleted = self._purge_piece()
            total += deleted
            if deleted < PURGE_PIECE:
                return total

    @transactional
    def _purge_piece(self) -> int:
        return entries.purge(self.database.session(), self.settings.retention_s, PURGE_PIECE)


def _entry_card(binding: ActiveBinding, request: EntryRequest, cards: CardCache) -> ModelCard:
    """The entry's model: its binding's, unless it names another."""
    if request.model:
        return cards(request.model, request.version)
    return cards(binding.model, request.version or binding.version)
