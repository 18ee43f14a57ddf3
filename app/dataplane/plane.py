"""The data plane: the operations every door calls.

A door (the HTTP API, the KServe v2 HTTP door, later gRPC and the log door)
only decodes its protocol into the typed requests of `app.dataplane.requests`,
calls one operation here with the caller's tenant, and maps what comes back,
or the `app.errors` it raises, to its own protocol. Each operation is one unit
of work: it takes the current scope's session (`Database.session()`; a door
opens the scope, or the HTTP request is one) and commits once, after which it
may wake workers. The services below it never commit.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from datetime import UTC, datetime
from typing import IO, Any, TypeVar

import redis
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.batches import files, results
from app.batches import service as batches
from app.batches.representation import describe
from app.batches.tables import Batch, File
from app.bindings import entries
from app.bindings import service as bindings
from app.bindings.entries import EntryOutcome, Finished
from app.bindings.service import ActiveBinding
from app.bindings.tables import StreamBinding
from app.cards import ModelCard
from app.dataplane.holds import Holds
from app.dataplane.requests import (
    BatchRequest,
    BindingFields,
    EntryRequest,
    InferRequest,
    JobQuery,
    JobRequest,
    ScheduleFields,
    Wait,
)
from app.errors import (
    CallerLeft,
    Conflict,
    DomainError,
    InferenceFailed,
    InvalidRequest,
    NotFound,
    Unavailable,
)
from app.jobs import dead_letters, idempotency, service, sync, transitions, usage
from app.jobs.admission import Admission
from app.jobs.dispatch import Dispatcher
from app.jobs.events import EventBus
from app.jobs.inserts import INSERT_JOBS, JobInserter
from app.jobs.replies import Replies
from app.jobs.tables import SYNC_PRIORITY, DeadLetter, Job
from app.observability import metrics
from app.platform.database import Database
from app.platform.filestore import FileStore
from app.platform.settings import Settings
from app.repository.registry import PUBLIC, ModelRepository
from app.runtime.sessions import SessionPool
from app.schedules import service as schedules
from app.schedules.tables import Schedule
from app.status.board import Status, StatusBoard, read_status
from app.tenancy.keys import Caller, KeyCache, TenantRef
from app.tenancy.quotas import Quotas, check_priority
from app.webhooks import delivery
from app.webhooks.tables import DisabledWebhookUrl

logger = logging.getLogger(__name__)

PURGE_PIECE = 5000  # stream entries' records deleted a transaction


class DataPlane:
    """One per process, built by the container with explicit dependencies."""

    def __init__(
        self,
        settings: Settings,
        database: Database,
        models: ModelRepository,
        events: EventBus,
        inserter: JobInserter,
        dispatcher: Dispatcher,
        admission: Admission,
        quotas: Quotas,
        holds: Holds,
        api_keys: KeyCache,
        status: StatusBoard,
        store: FileStore,
        sessions: Callable[[], SessionPool],
        records: JobInserter,
        replies: Replies,
    ) -> None:
        self.settings, self.database, self.models = settings, database, models
        self.events, self.inserter, self.dispatcher = events, inserter, dispatcher
        self.admission, self.quotas, self.holds = admission, quotas, holds
        self.api_keys, self.status_board, self.store = api_keys, status, store
        self._sessions = sessions  # ONNX Runtime sessions, for inline models only
        self.records = records  # inline calls' job records
        self.replies = replies  # where workers send this process's sync calls' answers

    # -- callers ------------------------------------------------------------------

    def authenticate(self, api_key: str) -> Caller | None:
        """The caller of an API key (its kind and tenant); None for an unknown,
        revoked or expired key. Cached per process for API_KEY_CACHE_SECONDS."""
        return self.api_keys.caller(self.database.session(), api_key)

    def authenticate_hash(self, key_hash: str) -> Caller | None:
        """As `authenticate`, by the key's hash (what a signed-in page keeps)."""
        return self.api_keys.caller_by_hash(self.database.session(), key_hash)

    # -- jobs ---------------------------------------------------------------------

    def submit(self, tenant: TenantRef, request: JobRequest) -> Job:
        """Check the inputs against the model, store the job, then wake its workers.

        The row is committed before its model's workers are woken, so a claim
        always sees it; if the wake-up fails, the job stays queued and the sweep
        wakes them. With an idempotency key, a repeat of the same request
        returns the first job. The tenant sees only the models its card grants.
        """
        card = self.models.resolve(request.model, request.version, tenant.name)
        return self._submit(tenant, card, request)

    def _submit(self, tenant: TenantRef, card: ModelCard, request: JobRequest) -> Job:
        arrays = service.check_inputs(card, request.inputs)
        if request.webhook is not None:
            service.check_webhook(request.webhook, self.settings)
        session = self.database.session()
        key, fingerprint = request.idempotency_key, ""
        if key is not None:
            fingerprint = service.fingerprint(request.model, request.version, request.inputs)
            earlier = idempotency.claim(session, tenant.id, key, fingerprint)
            if earlier is not None:
                job = service.get(session, tenant.id, earlier)
                session.commit()
                return job
        # Refusals keep nothing: QuotaExceeded names the limit, QueueFull the bound.
        self.quotas.admit_jobs(session, tenant.id, priority=request.priority)
        self.admission.admit(session, card.name)
        values = service.job_values(
            card, arrays, tenant.id, priority=request.priority, deadline=request.deadline,
            webhook=request.webhook, max_attempts=self.settings.job_max_attempts,
            reply_to=request.reply_to,
        )  # fmt: skip
        if key is None:
            # Committed together with concurrent submits, its model woken (app.jobs.inserts).
            job = Job(**values, **self.inserter.insert(values))
        else:
            # In this transaction, under the advisory lock `idempotency.claim` took.
            job = service.stage(session, values)
            idempotency.remember(session, tenant.id, key, fingerprint, job.id)
            session.commit()
            self._wake(session, job.model, [job.id])
        metrics.JOBS_SUBMITTED.labels(card.name, tenant.name).inc()
        return job

    def submit_many(
        self,
        tenant: TenantRef,
        requests: Sequence[JobRequest],
        *,
        staged: Callable[[Session, list[Job]], object] | None = None,
        key_field: str = "idempotency_key",
    ) -> list[Job | DomainError]:
        """Many jobs at once, in request order: each checked on its own (a bad one is
        its own error in the list; the others go on), then one quota count for all,
        one queue-bound count per model, one INSERT, one commit and one wake-up per
        model. A request with an idempotency key gets the job its key made before
        (as `submit`); a key repeated in the list gets its first use's outcome.
        `staged` runs in the transaction, just before it commits: a door's own
        rows beside the jobs. `key_field` names the key in errors (the door's name)."""
        outcomes: list[Job | DomainError | None] = [None] * len(requests)
        checked: list[tuple[int, ModelCard, dict[str, Any]]] = []
        cards = _Cards(self.models, tenant.name)
        for index, request in enumerate(requests):
            try:
                card = cards(request.model, request.version)
                arrays = service.check_inputs(card, request.inputs)
                if request.webhook is not None:
                    service.check_webhook(request.webhook, self.settings)
                checked.append((index, card, arrays))
            except DomainError as exc:
                outcomes[index] = exc
        if checked:
            keys = _Keys(requests, checked, key_field)
            self._stage_many(tenant, requests, keys, outcomes, staged)
            keys.repeat(outcomes)
        done = [outcome for outcome in outcomes if outcome is not None]
        assert len(done) == len(requests), "each request has its job or its error"
        return done

    def _stage_many(
        self,
        tenant: TenantRef,
        requests: Sequence[JobRequest],
        keys: _Keys,
        outcomes: list[Job | DomainError | None],
        staged: Callable[[Session, list[Job]], object] | None,
    ) -> None:
        session = self.database.session()
        checked = keys.claim(session, tenant.id, outcomes)
        admitted: list[tuple[int, ModelCard, dict[str, Any]]] = []
        # Refusals keep nothing: per priority the tenant's quotas, per model its bound.
        for group in _grouped(checked, lambda item: requests[item[0]].priority):
            try:
                priority = requests[group[0][0]].priority
                self.quotas.admit_jobs(
                    session, tenant.id, len(group), priority=priority, requests=len(group)
                )
                admitted += group
            except DomainError as exc:
                for index, _, _ in group:
                    outcomes[index] = exc
        values: list[dict[str, Any]] = []
        order: list[int] = []  # the request of each row
        for group in _grouped(admitted, lambda item: item[1].name):
            try:
                self.admission.admit(session, group[0][1].name, len(group))
            except DomainError as exc:
                for index, _, _ in group:
                    outcomes[index] = exc
                continue
            for index, card, arrays in group:
                request = requests[index]
                values.append(service.job_values(
                    card, arrays, tenant.id, priority=request.priority,
                    deadline=request.deadline, webhook=request.webhook,
                    max_attempts=self.settings.job_max_attempts, reply_to=request.reply_to,
                ))  # fmt: skip
                order.append(index)
        if not values:
            session.commit()
            return
        if keys.none and staged is None:
            # Nothing else to write with them: the rows go in the process's coalesced
            # INSERT (app.jobs.inserts), all in one statement, their models woken.
            session.commit()  # the admission reads' transaction: the wait holds none
            written = self.inserter.insert_many(values)
            jobs = [Job(**v, **d) for v, d in zip(values, written, strict=True)]
        else:
            jobs = service.stage_many(session, values)
            keys.remember(session, tenant.id, order, jobs)
            if staged is not None:
                staged(session, jobs)
            session.commit()
            for woken in _grouped(jobs, lambda job: job.model):
                self._wake(session, woken[0].model, [job.id for job in woken])
        for index, job in zip(order, jobs, strict=True):
            outcomes[index] = job
            metrics.JOBS_SUBMITTED.labels(job.model, tenant.name).inc()

    def _wake(self, session: Session, model: str, job_ids: list[uuid.UUID]) -> None:
        """After the commit: wake the model for these jobs, or leave them to the sweep."""
        if job_ids and not self.dispatcher.wake(model):
            transitions.mark_unsent(session, job_ids)
            session.commit()

    def infer(
        self,
        tenant: TenantRef,
        request: InferRequest,
        *,
        leaving: Callable[[Callable[[], None]], object] | None = None,
    ) -> sync.Answer:
        """Outputs for `request` within its timeout, holding one of the tenant's waits.

        Raises InputsDoNotFit before anything runs, InferenceFailed when the model
        failed the request, DeadlinePassed (naming the job) when it is unfinished.
        A door whose caller can go away early passes `leaving`, how to hear of it
        (gRPC's `context.add_callback`): the wait then ends, the job is cancelled,
        and CallerLeft is raised.
        """
        with self.holds.holding(tenant.id):
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
            self.cancel_jobs(tenant, [call.job_id])
            raise CallerLeft(f"the caller left before job {call.job_id} finished; cancelled")

    def start_call(self, tenant: TenantRef, request: InferRequest) -> sync.Call:
        """Check a sync call and submit its job, ahead of every async job of its
        model, without waiting for it (an inline model runs now: the call comes
        back done). For a door that follows many calls at once (`follow_calls`)."""
        card = self.models.resolve(request.model, request.version, tenant.name)
        timeout_s = self._call_timeout(request)
        give_up_at = time.monotonic() + timeout_s
        if sync.runs_inline(card):
            arrays = service.check_inputs(card, request.inputs)
            session = self.database.session()
            self.quotas.admit_jobs(session, tenant.id, 0)  # counted; never in flight
            session.commit()
            done = self._run_inline(tenant, card, arrays)
            return sync.Call(card, done.job_id, timeout_s, give_up_at, done)
        job = self._submit(tenant, card, _call_job(card, request, self.replies.channel))
        self.database.session().commit()  # the admission reads' transaction: a wait holds none
        return sync.Call(card, job.id, timeout_s, give_up_at)

    def _run_inline(
        self, tenant: TenantRef, card: ModelCard, arrays: dict[str, Any]
    ) -> sync.Answer:
        """Run an inline model's call here, then write its job record (succeeded or
        failed) with the process's other records in one group commit, before the
        caller is answered: the call is in GET /jobs/<id> and /usage like any job."""
        started_at, clock = datetime.now(UTC), time.perf_counter()
        outputs, failure = None, None
        try:
            outputs = sync.run_inline(self._sessions(), card, arrays).outputs
        except InferenceFailed as exc:
            failure = exc
        error = None if failure is None else (str(failure.extra.get("error_code")), failure.detail)
        record = service.record_values(
            card, arrays, tenant.id, started_at, time.perf_counter() - clock,
            outputs=outputs, error=error,
        )  # fmt: skip
        self.records.insert(record)
        metrics.JOBS_SUBMITTED.labels(card.name, tenant.name).inc()
        if failure is not None:
            failure.extra["job_id"] = str(record["id"])
            raise failure
        assert outputs is not None
        return sync.Answer(card, outputs, record["id"])

    def start_calls(
        self, tenant: TenantRef, requests: Sequence[InferRequest]
    ) -> list[sync.Call | DomainError]:
        """`start_call` for many calls at once (a stream's requests that arrived
        together): their jobs in one `submit_many`, each call's error its own."""
        now = time.monotonic()
        started: list[sync.Call | DomainError | None] = [None] * len(requests)
        queued: list[tuple[int, ModelCard, float]] = []
        jobs: list[JobRequest] = []
        cards = _Cards(self.models, tenant.name)
        for index, request in enumerate(requests):
            try:
                card = cards(request.model, request.version)
                if sync.runs_inline(card):
                    started[index] = self.start_call(tenant, request)
                    continue
            except DomainError as exc:
                started[index] = exc
                continue
            queued.append((index, card, self._call_timeout(request)))
            jobs.append(_call_job(card, request, self.replies.channel))
        for (index, card, timeout_s), job in zip(
            queued, self.submit_many(tenant, jobs), strict=True
        ):
            started[index] = (
                job if isinstance(job, DomainError)
                else sync.Call(card, job.id, timeout_s, now + timeout_s)
            )  # fmt: skip
        done = [call for call in started if call is not None]
        assert len(done) == len(requests), "each call is started or has its error"
        return done

    def _call_timeout(self, request: InferRequest) -> float:
        """How long a sync call's caller waits: its own timeout, else
        SYNC_TIMEOUT_SECONDS; never more than MAX_WAIT_SECONDS."""
        settings = self.settings
        return min(request.timeout_s or settings.sync_timeout_seconds, settings.max_wait_seconds)

    def follow_calls(self, tenant: TenantRef, gather_s: float = 0.0) -> sync.Calls:
        """A follower for many of the tenant's calls (`start_call`): add each, then
        take them back as they end. Close it when done. `gather_s`: how long to let
        changes gather after the first before reading them (for many calls: fewer
        reads, each answer that much later)."""
        return sync.Calls(self.database.engine, self.replies.follow(), tenant.id, gather_s)

    def hold(self, tenant: TenantRef) -> Callable[[], None]:
        """One of the tenant's waits, for a door that keeps a caller waiting for
        long (a gRPC stream); TooManyWaits beyond its share. Returns its release."""
        return self.holds.acquire(tenant.id)

    def cancel_jobs(self, tenant: TenantRef, job_ids: list[uuid.UUID]) -> int:
        """Cancel those of the tenant's jobs that are still unfinished (a caller that
        went away): queued ones at once, running ones at their next checkpoint.
        Finished and unknown ones are left as they are. Returns how many were."""
        if not job_ids:
            return 0
        session = self.database.session()
        cancelled = transitions.request_cancel_many(session, tenant.id, job_ids)
        session.commit()
        return cancelled

    def get(self, tenant: TenantRef, job_id: uuid.UUID) -> Job:
        """The tenant's job with its outputs; another tenant's is NotFound."""
        session = self.database.session()
        job = service.get(session, tenant.id, job_id)
        session.commit()
        return job

    def wait(self, tenant: TenantRef, job_id: uuid.UUID, wait: Wait) -> Job:
        """The job after waiting (holding one of the tenant's waits) for its next
        change or its end, or as it stands when the time is up."""
        if wait.seconds <= 0:
            return self.get(tenant, job_id)
        session = self.database.session()
        with self.holds.holding(tenant.id):
            if wait.until == "change":
                return service.wait_for_change(
                    session, self.events, tenant.id, job_id, wait.seconds
                )
            return service.wait_until_finished(
                session, self.events, tenant.id, job_id, wait.seconds
            )

    def list_jobs(self, tenant: TenantRef, query: JobQuery) -> service.Page:
        session = self.database.session()
        page = service.list_jobs(
            session, tenant.id, limit=query.limit, status=query.status, model=query.model,
            cursor=query.cursor, outputs=query.outputs,
        )  # fmt: skip
        session.commit()
        return page

    def cancel(self, tenant: TenantRef, job_id: uuid.UUID) -> Job:
        """Cancel a queued job at once; a running one stops at its next checkpoint
        (before its result is written). A finished job cannot be cancelled: Conflict."""
        session = self.database.session()
        status = transitions.request_cancel(session, tenant.id, job_id)
        session.commit()
        job = service.get(session, tenant.id, job_id)
        if status is None:
            raise Conflict(
                f"job {job_id} is already {job.status}; only queued or running jobs can be "
                "cancelled",
                job_status=job.status,
            )
        session.refresh(job)
        session.commit()
        return job

    def follow(self, tenant: TenantRef, job_id: uuid.UUID, after: int) -> Callable[[], None] | None:
        """Before a job's event stream: NotFound for another tenant's job, None when
        a stream resumed after event `after` has nothing left to send (the job
        finished and its terminal event was sent); otherwise one of the tenant's
        waits, held until the returned release is called (when the stream ends)."""
        session = self.database.session()
        service.get(session, tenant.id, job_id)
        due = service.events_due(session, job_id, after)
        session.commit()
        return self.holds.acquire(tenant.id) if due else None

    # -- batches, files, dead letters ----------------------------------------------
    # (Their services still commit inside; moving those commits up here is next.)

    def create_batch(self, tenant: TenantRef, request: BatchRequest) -> Batch:
        """A batch of inline rows (cut into chunks now) or of an uploaded file
        (checked at its start now, cut by a worker)."""
        webhook, session = request.webhook, self.database.session()
        batch = batches.create(
            session, self.store, self.models, self.settings, tenant.id, request.model,
            request.version, inputs=request.inputs, file_id=request.file_id,
            webhook={"url": webhook.url, "events": list(webhook.events)} if webhook else None,
            tenant=tenant.name, quotas=self.quotas, admission=self.admission,
        )  # fmt: skip
        session.commit()
        if batch.input_file_id is None:
            self.dispatcher.wake(batch.model)  # its chunks are queued
        elif not self.start_split(batch.id):
            logger.warning("batch %s: split not sent; the sweep sends it", batch.id)
        return batch

    def batch(self, tenant: TenantRef, batch_id: uuid.UUID) -> dict[str, Any]:
        """The tenant's batch with its progress counted from its chunks."""
        session = self.database.session()
        described = describe(session, batches.get(session, tenant.id, batch_id))
        session.commit()
        return described

    def list_batches(self, tenant: TenantRef, limit: int) -> list[dict[str, Any]]:
        """The tenant's newest batches, each with its progress."""
        session = self.database.session()
        found = [describe(session, b) for b in batches.list_batches(session, tenant.id, limit)]
        session.commit()
        return found

    def cancel_batch(self, tenant: TenantRef, batch_id: uuid.UUID) -> dict[str, Any]:
        """Stop a batch: queued chunks (and the rest of its split) at once, running
        ones when they finish; Conflict once it has finished."""
        session = self.database.session()
        described = describe(session, batches.cancel(session, tenant.id, batch_id))
        session.commit()
        return described

    def batch_results(
        self, tenant: TenantRef, batch_id: uuid.UUID, fmt: str, output: str | None
    ) -> tuple[Iterator[bytes], str]:
        """The batch's outputs in input order as `fmt` (JSONL; .npy or Parquet of
        `output` or of every output), and a file name; Conflict while unfinished or,
        for .npy and Parquet, with rows missing. The stream reads its chunks in
        sessions of its own and their parts from the file store, one at a time."""
        session = self.database.session()
        batch = batches.get(session, tenant.id, batch_id)
        card = self.models.card(batch.model, batch.model_version)
        counted = batches.progress(session, batch)
        results.check_ready(batch, counted.rows_failed, fmt)
        chunks = results.chunks(self.database.sessionmaker, self.store, batch.id)
        name = f"batch-{batch.id}"
        session.commit()
        if fmt == results.NPY:
            names = results.numeric_outputs(card, output)
            return results.npy(names, counted.rows_done, chunks), name + ".npy"
        if fmt == results.PARQUET:
            names = results.numeric_outputs(card, output)
            return results.parquet_file(card, names, chunks), name + ".parquet"
        return results.jsonl(card, chunks), name + ".jsonl"

    def start_split(self, batch_id: uuid.UUID) -> bool:
        """Ask a worker to cut a file batch; False if the broker refused (the sweep
        sends it again)."""
        return batches.start_split(self.dispatcher, batch_id)

    def upload(self, tenant: TenantRef, filename: str, fmt: str, body: IO[bytes]) -> File:
        """Store an upload (committed); TooLarge past MAX_UPLOAD_BYTES, QuotaExceeded
        past what the tenant may still store."""
        session = self.database.session()
        file = files.store(
            session, self.store, tenant.id, filename, fmt, body,
            self.settings.max_upload_bytes, self.quotas,
        )  # fmt: skip
        session.commit()
        return file

    def file(self, tenant: TenantRef, file_id: uuid.UUID) -> File:
        session = self.database.session()
        found = files.get(session, tenant.id, file_id)
        session.commit()
        return found

    def list_files(self, tenant: TenantRef) -> list[File]:
        session = self.database.session()
        found = files.list_files(session, tenant.id)
        session.commit()
        return found

    def delete_file(self, tenant: TenantRef, file_id: uuid.UUID) -> None:
        """Delete an upload, and then its object; Conflict while a batch or a schedule
        reads it."""
        session = self.database.session()
        key = files.remove(session, tenant.id, file_id)
        session.commit()
        if key is not None:
            self.store.delete(key)

    def replay_dead_letter(self, tenant: TenantRef, letter_id: int, actor: str) -> uuid.UUID:
        """Put the letter's job back in the queue, same id; Conflict if it cannot be."""
        session = self.database.session()
        replayed = dead_letters.replay(session, tenant.id, letter_id, actor)
        self._requeued(session, replayed)
        return replayed.ids[0]

    def replay_dead_letters(
        self, tenant: TenantRef, filters: dead_letters.Filters, limit: int, actor: str
    ) -> list[uuid.UUID]:
        """Replay every unreplayed letter that matches, oldest first, up to `limit`."""
        session = self.database.session()
        replayed = dead_letters.replay_matching(session, tenant.id, filters, limit, actor)
        self._requeued(session, replayed)
        return replayed.ids

    def _requeued(self, session: Session, replayed: dead_letters.Replayed) -> None:
        """Send its webhooks again and commit a replay, then wake its models (those
        that do not wake: the sweep)."""
        if replayed.deliveries:
            delivery.redeliver(session, replayed.deliveries)
        session.commit()
        for model, job_ids in replayed.woken.items():
            self._wake(session, model, job_ids)

    def dead_letters(
        self, tenant: TenantRef, filters: dead_letters.Filters, limit: int, before: int | None
    ) -> tuple[list[DeadLetter], int | None]:
        """The tenant's dead letters, newest first, and the next page's cursor."""
        session = self.database.session()
        page = dead_letters.list_letters(session, tenant.id, filters, limit, before)
        session.commit()
        return page

    def dead_letter(self, tenant: TenantRef | None, letter_id: int) -> DeadLetter:
        """A tenant's dead letter; with no tenant (an operator), any tenant's."""
        session = self.database.session()
        letter = dead_letters.get(session, tenant.id if tenant else None, letter_id)
        session.commit()
        return letter

    def purge_dead_letter(self, tenant: TenantRef, letter_id: int, actor: str) -> None:
        """Delete a letter (audited); its job stays as it ended."""
        session = self.database.session()
        dead_letters.purge(session, tenant.id, letter_id, actor)
        session.commit()

    # -- models and health ---------------------------------------------------------

    def model(self, tenant: str | None, name: str, version: str | None = None) -> ModelCard:
        """The card the caller may see: `tenant` a tenant's name, PUBLIC for an
        anonymous caller (open models only), None for an operator (every model).
        Another tenant's model is UnknownModel, like an absent one."""
        return self.models.resolve(name, version, tenant)

    def list_models(self, tenant: str | None) -> list[tuple[ModelCard, list[str]]]:
        """The serving models the caller may see, each with its serving versions."""
        cards = [self.models.resolve(name) for name in self.models.names(tenant)]
        return [(card, self.models.versions(card.name)) for card in cards]

    def model_ready(self, tenant: str | None, name: str, version: str | None = None) -> ModelCard:
        """The card of a model that can serve now; Unavailable while its file is gone."""
        card = self.model(tenant, name, version)
        if not card.onnx_path.is_file():
            raise Unavailable(
                f"model {card.ref} is not ready: {card.onnx_path.name} is missing", retry_after=5
            )
        return card

    def readiness(self) -> dict[str, str]:
        """Each dependency's state, `ok` or why not: PostgreSQL and Redis answer, and
        at least one model is built."""
        return {"database": self._check_database(), "redis": self._check_redis(),
                "models": self._check_models()}  # fmt: skip

    def _check_database(self) -> str:
        try:
            self.database.ping()
        except SQLAlchemyError as exc:
            return f"unreachable ({type(exc).__name__})"
        return "ok"

    def _check_redis(self) -> str:
        url = self.settings.redis_url
        try:
            redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2).ping()
        except (redis.RedisError, OSError) as exc:
            return f"unreachable ({type(exc).__name__})"
        return "ok"

    def _check_models(self) -> str:
        if not self.models.all():
            self.models.refresh()
        if not self.models.all():
            return "no model is built; run `python manage.py models build`"
        return "ok"

    # -- schedules -----------------------------------------------------------------

    def create_schedule(self, tenant: TenantRef, fields: ScheduleFields) -> Schedule:
        """A cron schedule of batch runs; its first tick is the next one."""
        session = self.database.session()
        schedule = schedules.create(session, self.models, self.settings, tenant.id, dict(fields))
        session.commit()
        return schedule

    def update_schedule(
        self, tenant: TenantRef, schedule_id: uuid.UUID, changes: ScheduleFields
    ) -> Schedule:
        session = self.database.session()
        schedule = schedules.update_schedule(
            session, self.models, self.settings, tenant.id, schedule_id, dict(changes)
        )
        session.commit()
        return schedule

    def delete_schedule(self, tenant: TenantRef, schedule_id: uuid.UUID) -> None:
        """Its runs stay, as batches."""
        session = self.database.session()
        schedules.delete(session, tenant.id, schedule_id)
        session.commit()

    def get_schedule(self, tenant: TenantRef, schedule_id: uuid.UUID) -> Schedule:
        session = self.database.session()
        schedule = schedules.get(session, tenant.id, schedule_id)
        session.commit()
        return schedule

    def list_schedules(self, tenant: TenantRef) -> list[Schedule]:
        session = self.database.session()
        found = schedules.list_schedules(session, tenant.id)
        session.commit()
        return found

    def schedule_runs(self, tenant: TenantRef, schedule_id: uuid.UUID, limit: int) -> list[Batch]:
        """Its runs, newest tick first: each a batch."""
        return schedules.runs(self.database.session(), tenant.id, schedule_id, limit)

    # -- webhook deliveries and usage ----------------------------------------------

    def deliveries(self, tenant: TenantRef, job_id: uuid.UUID) -> list[delivery.Logged]:
        """The job's webhook deliveries, each with its attempts."""
        session = self.database.session()
        service.get(session, tenant.id, job_id)
        log = delivery.log_of(session, job_id)
        session.commit()
        return log

    def redeliver(self, tenant: TenantRef, job_id: uuid.UUID, delivery_id: int) -> delivery.Logged:
        """Send a delivery again from the start of its schedule (same webhook-id),
        enabling its URL if it was disabled for failing; Conflict while it is being
        sent, or when its URL answered 410 Gone (enable that first)."""
        session = self.database.session()
        service.get(session, tenant.id, job_id)
        if not delivery.log_of(session, job_id, delivery_id):
            raise NotFound(f"job {job_id} has no delivery {delivery_id}")
        if not delivery.redeliver(session, [delivery_id]):
            session.rollback()
            raise Conflict(
                f"delivery {delivery_id} is being sent now, or its URL answered 410 Gone and "
                "is disabled for your tenant: DELETE /webhook-urls/disabled?url=... enables it"
            )
        session.commit()
        [logged] = delivery.log_of(session, job_id, delivery_id)
        session.commit()
        return logged

    def disabled_webhook_urls(self, tenant: TenantRef) -> list[DisabledWebhookUrl]:
        """The tenant's disabled webhook URLs, each with why and since when."""
        session = self.database.session()
        found = delivery.disabled_urls(session, tenant.id)
        session.commit()
        return found

    def enable_webhook_url(self, tenant: TenantRef, url: str) -> None:
        """Send to a disabled URL again (a 410's or a failing one's); NotFound if it
        is not disabled for the tenant."""
        session = self.database.session()
        if not delivery.enable(session, tenant.id, url):
            session.rollback()
            raise NotFound(f"{url} is not a disabled webhook URL of your tenant")
        session.commit()

    def usage_report(
        self, tenant: TenantRef, start: datetime, end: datetime
    ) -> list[usage.ModelUsage]:
        """Per model, the tenant's jobs created in [start, end) and what they cost."""
        session = self.database.session()
        report = usage.report(session, tenant.id, start, end)
        session.commit()
        return report

    def status(self, *, operator: bool) -> Status:
        """The status page's numbers: aggregates of the public models for anyone, the
        whole board with the newest dead letters for an operator."""
        session = self.database.session()
        public_models = set(self.models.names(PUBLIC))
        status = read_status(session, self.status_board, public_models, operator=operator)
        session.commit()
        return status

    # -- stream bindings and the log door ------------------------------------------

    def create_binding(self, tenant: TenantRef, fields: BindingFields) -> StreamBinding:
        """Bind a model to an input and an output log under the tenant's prefix;
        consumers start reading it within STREAMS_REFRESH_SECONDS."""
        session = self.database.session()
        prefix = self.settings.streams_prefix
        binding = bindings.create(session, self.models, prefix, tenant, dict(fields))
        session.commit()
        return binding

    def update_binding(
        self, tenant: TenantRef, binding_id: uuid.UUID, changes: BindingFields
    ) -> StreamBinding:
        session = self.database.session()
        prefix = self.settings.streams_prefix
        binding = bindings.update(session, self.models, prefix, tenant, binding_id, dict(changes))
        session.commit()
        return binding

    def delete_binding(self, tenant: TenantRef, binding_id: uuid.UUID) -> None:
        """Its jobs stay; its logs and consumer group stay too (they are the tenant's)."""
        session = self.database.session()
        bindings.delete(session, tenant.id, binding_id)
        session.commit()

    def get_binding(self, tenant: TenantRef, binding_id: uuid.UUID) -> StreamBinding:
        session = self.database.session()
        binding = bindings.get(session, tenant.id, binding_id)
        session.commit()
        return binding

    def list_bindings(self, tenant: TenantRef) -> list[StreamBinding]:
        session = self.database.session()
        found = bindings.list_bindings(session, tenant.id)
        session.commit()
        return found

    def active_bindings(self) -> list[ActiveBinding]:
        """Every unpaused binding, for the stream consumers."""
        session = self.database.session()
        found = bindings.active(session)
        session.commit()
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
        session = self.database.session()
        tenant = binding.tenant
        ids = [request.entry_id for request in requests]
        known = entries.accepted(session, binding.id, ids) if find_redelivered else {}
        limits = self.quotas.limits(session, tenant.id)
        outcomes: dict[str, EntryOutcome] = {}
        cards = _Cards(self.models, tenant.name)
        staged: list[tuple[EntryRequest, dict[str, Any]]] = []
        for request in requests:
            if request.entry_id in known:
                outcomes[request.entry_id] = EntryOutcome(
                    request.entry_id, known[request.entry_id], redelivered=True
                )
                continue
            try:
                card = self._entry_card(binding, request, cards)
                arrays = service.check_inputs(card, request.inputs)
                check_priority(request.priority, limits)
            except DomainError as exc:  # this entry's own fault: a dead letter
                outcomes[request.entry_id] = EntryOutcome(request.entry_id, error=exc)
                continue
            values = service.job_values(
                card, arrays, tenant.id, priority=request.priority, deadline=None,
                webhook=None, max_attempts=self.settings.job_max_attempts,
            )  # fmt: skip
            staged.append((request, values))
        by_model = Counter(values["model"] for _, values in staged)
        if staged:  # refusals keep nothing: QuotaExceeded names the limit, QueueFull the bound
            self.quotas.admit_jobs(session, tenant.id, len(staged), requests=len(staged))
            for model, count in by_model.items():
                self.admission.admit(session, model, count)
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
        session.commit()
        for model in by_model:
            woken = [values["id"] for values in made if values["model"] == model]
            self._wake(session, model, woken)
            metrics.JOBS_SUBMITTED.labels(model, tenant.name).inc(len(woken))
        return [outcomes[entry_id] for entry_id in ids]

    def _entry_card(
        self, binding: ActiveBinding, request: EntryRequest, cards: _Cards
    ) -> ModelCard:
        """The entry's model: its binding's, unless it names another."""
        if request.model:
            return cards(request.model, request.version)
        return cards(binding.model, request.version or binding.version)

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
        session.commit()
        return done

    def purge_stream_entries(self) -> int:
        """Delete published entries' records older than RETENTION_SECONDS (none when
        0), in pieces of their own transactions (one commit a piece, on purpose: a
        day of a busy log is millions of rows) until none is left."""
        age = self.settings.retention_seconds
        if age <= 0:
            return 0
        session, total = self.database.session(), 0
        while True:
            deleted = entries.purge(session, age, PURGE_PIECE)
            session.commit()
            total += deleted
            if deleted < PURGE_PIECE:
                return total


def _call_job(card: ModelCard, request: InferRequest, reply_to: str) -> JobRequest:
    """A sync call's job: ahead of every async job of its model (a caller waits),
    its answer sent to this process's reply channel."""
    return JobRequest(
        card.name, request.inputs, version=card.version, priority=SYNC_PRIORITY,
        deadline=request.deadline, reply_to=reply_to,
    )  # fmt: skip


class _Cards:
    """The cards one batch asks for, each looked up once (a lookup's error too)."""

    def __init__(self, models: ModelRepository, tenant: str) -> None:
        self._models, self._tenant = models, tenant
        self._found: dict[tuple[str, str | None], ModelCard | DomainError] = {}

    def __call__(self, model: str, version: str | None) -> ModelCard:
        key = (model, version)
        if key not in self._found:
            try:
                self._found[key] = self._models.resolve(model, version, self._tenant)
            except DomainError as exc:
                self._found[key] = exc
        found = self._found[key]
        if isinstance(found, DomainError):
            raise found
        return found


T = TypeVar("T")


class _Keys:
    """The idempotency keys of a bulk submit: the first use of each key is claimed
    (its earlier job returned instead of a new one), later uses of the same key
    in the list repeat the first's outcome, or are an error for another request."""

    def __init__(
        self,
        requests: Sequence[JobRequest],
        checked: list[tuple[int, ModelCard, dict[str, Any]]],
        field: str,
    ) -> None:
        self._requests, self._checked, self._field = requests, checked, field
        self._first: dict[str, int] = {}  # key: the request that uses it first
        self._prints: dict[str, str] = {}
        # (request, the first with its key; None: that key's first use was another request)
        self._repeats: list[tuple[int, int | None]] = []
        self._unkeyed: list[tuple[int, ModelCard, dict[str, Any]]] = []
        self._keyed: list[tuple[int, ModelCard, dict[str, Any]]] = []
        for item in checked:
            request = requests[item[0]]
            key = request.idempotency_key
            if key is None:
                self._unkeyed.append(item)
                continue
            print_ = service.fingerprint(request.model, request.version, request.inputs)
            if key in self._first:
                same = self._prints[key] == print_
                self._repeats.append((item[0], self._first[key] if same else None))
                continue
            self._first[key], self._prints[key] = item[0], print_
            self._keyed.append(item)

    @property
    def none(self) -> bool:
        """No request of the list has a key."""
        return not self._keyed and not self._repeats

    def claim(
        self, session: Session, tenant_id: int, outcomes: list[Job | DomainError | None]
    ) -> list[tuple[int, ModelCard, dict[str, Any]]]:
        """Hold the keys; what is left to stage, in request order. A key's earlier
        job (or its refusal) becomes that request's outcome at once."""
        if not self._keyed:
            return self._checked
        claimed = idempotency.claim_many(session, tenant_id, self._prints, self._field)
        earlier: dict[uuid.UUID, Job | None] = {
            job_id: None for job_id in claimed.values() if isinstance(job_id, uuid.UUID)
        }
        if earlier:
            for job in service.get_many(session, tenant_id, list(earlier)):
                earlier[job.id] = job
        left = list(self._unkeyed)
        for item in self._keyed:
            key = self._requests[item[0]].idempotency_key
            assert key is not None
            outcome = claimed[key]
            if outcome is None:
                left.append(item)
            elif isinstance(outcome, DomainError):
                outcomes[item[0]] = outcome
            else:
                outcomes[item[0]] = earlier[outcome] or NotFound(
                    f"the job this {self._field} made ({outcome}) is gone",
                    errors={self._field: ["its job was deleted; use a new key"]},
                )
        return sorted(left, key=lambda item: item[0])

    def remember(self, session: Session, tenant_id: int, order: list[int], jobs: list[Job]) -> None:
        """Record the keys of the new jobs, in their transaction."""
        for index, job in zip(order, jobs, strict=True):
            key = self._requests[index].idempotency_key
            if key is not None:
                idempotency.remember(session, tenant_id, key, self._prints[key], job.id)

    def repeat(self, outcomes: list[Job | DomainError | None]) -> None:
        """A key's later uses: the first's outcome, or an error for another request."""
        for index, first in self._repeats:
            outcomes[index] = (
                outcomes[first] if first is not None
                else InvalidRequest(
                    f"this {self._field} is used earlier in the list with a different "
                    "request; give each request its own key",
                    errors={self._field: ["already used with a different request body"]},
                )
            )  # fmt: skip


def _grouped(items: list[T], key: Callable[[T], Any]) -> list[list[T]]:
    """`items` in groups of equal `key`, each group in the order its items came."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())
