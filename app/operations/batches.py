"""Batches: many rows of one model, run as chunk jobs through the one job-running
path. A tenant makes, reads, cancels them and streams their results; a worker
cuts a file batch into chunks (a unit of work a chunk, resuming where it
stopped) and the sweep finishes batches no finish settled. A batch finishes when
its last chunk does: `settle` runs in a unit after every one that may have
finished chunks (the last committer always sees all of them)."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from app.batches import creation, files, openai_format, progress, readers, results, splitting
from app.batches.creation import BATCH_EVENTS, SPLIT_TASK, Chunking
from app.batches.representation import BatchSchema, describe
from app.batches.tables import Batch
from app.errors import InvalidRequest, UnknownModel
from app.execution.dispatch import Dispatcher
from app.jobs import staging
from app.jobs.admission import Admission
from app.jobs.chunks import settle
from app.operations.requests import BatchRequest
from app.platform.database import Database, transactional
from app.platform.filestore import FileStore
from app.repository.registry import ModelRepository
from app.statuses import BatchStatus
from app.tenancy.keys import TenantRef
from app.tenancy.quotas import Quotas
from app.webhooks.ssrf import UrlPolicy

__all__ = [
    "BATCH_EVENTS",
    "SPLIT_TASK",
    "BatchOperations",
    "BatchSchema",
    "BatchSettings",
    "results",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchSettings:
    """How batches are cut (BATCH_CHUNK_*), which webhook URLs they may name, and
    how long a split may stand still before the sweep sends it again
    (REPUBLISH_AFTER_SECONDS)."""

    chunking: Chunking
    webhooks: UrlPolicy
    republish_after_s: float


class BatchOperations:
    def __init__(
        self,
        database: Database,
        store: FileStore,
        repository: ModelRepository,
        limits: tuple[Quotas, Admission],
        dispatcher: Dispatcher,
        settings: BatchSettings,
    ) -> None:
        """`limits`: the tenants' quotas and each model's queue bound."""
        self.database, self._store, self._repository = database, store, repository
        (self._quotas, self._admission), self._dispatcher = limits, dispatcher
        self.settings = settings

    def create(self, tenant: TenantRef, request: BatchRequest) -> dict[str, Any]:
        """A batch of inline rows (cut into chunks now) or of an uploaded file
        (checked at its start now, cut by a worker); as GET /batches/<id> shows it."""
        batch = self._create(tenant, request)
        return describe(self.database.session(), batch)

    @transactional
    def _create(self, tenant: TenantRef, request: BatchRequest) -> Batch:
        session = self.database.session()
        card = self._repository.resolve(request.model, request.version, tenant.name)
        if (request.inputs is None) == (request.file_id is None):
            raise InvalidRequest(
                "send either `inputs` (rows, as in a job) or `file_id` (an uploaded file)",
                errors={"inputs": ["exactly one of inputs and file_id"]},
            )
        hook = request.webhook
        if hook is not None:
            self.settings.webhooks.check(hook.url)
        webhook = {"url": hook.url, "events": list(hook.events)} if hook else None
        if card.generation is not None:  # refused while its token budget is spent
            self._quotas.admit_tokens(session, tenant.id)
        batch = creation.new_batch(card, self.settings.chunking, tenant.id, webhook)
        batch.openai = request.openai
        if request.file_id is not None:  # its rows are counted once it is cut
            creation.attach_file(session, self._store, batch, card, request.file_id)
            self._quotas.admit_batch(session, tenant.id, None, 1)
            self._admission.admit(session, card.name)
            session.add(batch)
            session.flush()
            self.database.once_committed(lambda: self._send_split(batch.id))
            return batch
        arrays = staging.check_rows(card, request.inputs)
        rows = len(next(iter(arrays.values())))
        chunks = creation.chunks_of(batch, rows)
        # Refusals keep nothing: QuotaExceeded names the limit, QueueFull the bound.
        self._quotas.admit_batch(session, tenant.id, rows, chunks)
        self._admission.admit(session, card.name, chunks)
        creation.add_rows(session, batch, arrays)
        self.database.once_committed(lambda: self._dispatcher.wake(batch.model))
        return batch

    def _send_split(self, batch_id: uuid.UUID) -> None:
        if not self.start_split(batch_id):
            logger.warning("batch %s: split not sent; the sweep sends it", batch_id)

    def get(self, tenant: TenantRef, batch_id: uuid.UUID) -> dict[str, Any]:
        """The tenant's batch with its progress counted from its chunks."""
        session = self.database.session()
        return describe(session, progress.get(session, tenant.id, batch_id))

    def list_batches(self, tenant: TenantRef, limit: int) -> list[dict[str, Any]]:
        """The tenant's newest batches, each with its progress."""
        return self.describe(progress.list_batches(self.database.session(), tenant.id, limit))

    def describe(self, batches: list[Batch]) -> list[dict[str, Any]]:
        """These batches as GET /batches/<id> shows them (a schedule's runs)."""
        session = self.database.session()
        return [describe(session, batch) for batch in batches]

    def cancel(self, tenant: TenantRef, batch_id: uuid.UUID) -> dict[str, Any]:
        """Stop a batch: queued chunks (and the rest of its split) at once, running
        ones when they finish; Conflict once it has finished."""
        self._cancel(tenant, batch_id)
        self._settle([batch_id])
        return self.get(tenant, batch_id)

    @transactional
    def _cancel(self, tenant: TenantRef, batch_id: uuid.UUID) -> None:
        progress.cancel(self.database.session(), tenant.id, batch_id)

    def results(
        self, tenant: TenantRef, batch_id: uuid.UUID, fmt: str, output: str | None
    ) -> tuple[Iterator[bytes], str]:
        """The batch's outputs in input order as `fmt` (JSONL; .npy or Parquet of
        `output` or of every output; OpenAI's output or error file), and a file name;
        Conflict while unfinished or, for .npy and Parquet, with rows missing. The
        stream reads its chunks in sessions of its own and their parts from the file
        store, one at a time."""
        session = self.database.session()
        batch = progress.get(session, tenant.id, batch_id)
        card = self._repository.card(batch.model, batch.model_version)
        counted = progress.progress(session, batch)
        results.check_ready(batch, counted.rows_failed, fmt)
        chunks = results.chunks(self.database.sessionmaker, self._store, batch.id)
        name = f"batch-{batch.id}"
        self.database.end_reads()  # the stream holds no connection while a client reads
        if fmt in openai_format.FILES:  # OpenAI's output or error file
            endpoint = (batch.openai or {}).get("endpoint", "")
            errors = fmt == openai_format.ERRORS
            return openai_format.output(batch.model, endpoint, chunks, errors), name + ".jsonl"
        if fmt == results.NPY:
            names = results.numeric_outputs(card, output)
            return results.npy(names, counted.rows_done, chunks), name + ".npy"
        if fmt == results.PARQUET:
            names = results.numeric_outputs(card, output)
            return results.parquet_file(card, names, chunks), name + ".parquet"
        return results.jsonl(card, chunks), name + ".jsonl"

    # -- the workers' side ---------------------------------------------------------

    def start_split(self, batch_id: uuid.UUID) -> bool:
        """Ask a worker to cut a file batch; False if the broker refused (the sweep
        sends it again)."""
        return self._dispatcher.send(SPLIT_TASK, str(batch_id))

    def split(self, batch_id: uuid.UUID) -> str:
        """Cut a file batch into chunk jobs, from where an earlier split stopped,
        waking its model after each step; what happened, for the task's log."""
        batch = self.database.session().get(Batch, batch_id)
        self.database.end_reads()  # a unit of work a chunk from here on
        if (
            batch is None
            or batch.status != BatchStatus.QUEUED
            or batch.cancel_requested_at is not None
        ):
            return "nothing to split"
        try:
            cut = self._cut(batch)
        except (readers.BadRows, UnknownModel) as exc:
            code = "model_unavailable" if isinstance(exc, UnknownModel) else exc.code
            self._fail(batch.id, code, str(exc))
            self._settle([batch.id])
            return f"failed: {exc}"
        if cut is None:
            return "stopped: cancelled, or split elsewhere"
        rows, chunks = cut
        started = self._mark_split(batch.id, rows, chunks)
        self._settle([batch.id])
        return f"split {rows} rows into {chunks} chunks" if started else "split elsewhere"

    def _cut(self, batch: Batch) -> tuple[int, int] | None:
        """Every remaining chunk; the rows and chunks there are, or None when a step
        found the batch cancelled or split elsewhere (that step wrote nothing)."""
        card = self._repository.resolve_rescanning(batch.model, batch.model_version)
        if batch.input_file_id is None:
            raise readers.BadRows(batch.split_rows, "its input file was deleted")
        session = self.database.session()
        file = files.get(session, batch.tenant_id, batch.input_file_id)
        plan = splitting.in_place(session, self._store, card, file)
        if plan is not None:
            step = partial(splitting.split_in_place, batch=batch, file=file, plan=plan)
            if not self._step(batch, step):
                return None
            rows = plan.shape[0]
            return rows, math.ceil(rows / batch.chunk_rows)
        index, row = batch.split_rows // batch.chunk_rows, batch.split_rows
        with ExitStack() as held:
            parts = splitting.file_chunks(
                self.database.sessionmaker, self._store, held, card, file, batch, row
            )
            self.database.end_reads()
            for cut in parts:
                step = partial(
                    splitting.cut_chunk, store=self._store, batch=batch, place=(index, row),
                    cut=cut, inline=card.generation is not None,
                )  # fmt: skip
                if not self._step(batch, step):
                    return None
                index, row = index + 1, row + splitting.cut_rows(cut)
        return row, index

    def _step(self, batch: Batch, step: Callable[[Session], bool]) -> bool:
        """One step of a split, its own unit of work; the batch's model woken once it
        committed. False (nothing written) when the batch was cancelled or is being
        split elsewhere."""
        with self.database.unit_of_work() as session:
            done = step(session)
        if done:
            self._dispatcher.wake(batch.model)
        return done

    @transactional
    def _fail(self, batch_id: uuid.UUID, code: str, message: str) -> None:
        splitting.fail(self.database.session(), batch_id, code, message)

    @transactional
    def _mark_split(self, batch_id: uuid.UUID, rows: int, chunks: int) -> bool:
        return splitting.mark_split(self.database.session(), batch_id, rows, chunks)

    @transactional
    def _settle(self, batch_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Finish those of these batches whose every chunk has finished (after their
        chunks' changes were committed)."""
        return settle(self.database.session(), batch_ids)

    def sweep(self) -> int:
        """Finish batches whose last chunk ended where no settle followed (a lease or
        deadline sweep, a worker that died after its commit), and send the split
        again for file batches whose splitter stopped. Returns batches touched."""
        finished = self._settle(splitting.open_batches(self.database.session()))
        stale = splitting.stale(self.database.session(), self.settings.republish_after_s)
        self.database.end_reads()
        for batch_id in stale:
            self.start_split(batch_id)
        return len(finished) + len(stale)
