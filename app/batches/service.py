"""Batches: many rows for one model, cut into chunk jobs.

A chunk is an ordinary job (`jobs.batch_id`), so workers claim, lease, retry
and dead-letter it like any other, through the one job-running path; a row is
never a job of its own. Inline rows are cut at submit; a file is cut by a
worker task (`split`), a chunk per transaction, resuming where it stopped.

A batch finishes when its last chunk does: `settle` runs after every commit
that may have finished chunks (the last committer always sees all of them) and
in the sweep, and its guarded UPDATE finishes a batch once, writing its
webhook deliveries in the same statement.
"""

from __future__ import annotations

import io
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import numpy as np
from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.batches import files, parquet, readers
from app.batches.tables import BATCH_TERMINAL_STATUSES, Batch, File
from app.cards import ModelCard
from app.errors import Conflict, InputsDoNotFit, InvalidRequest, UnknownModel
from app.jobs.admission import Admission
from app.jobs.chunks import CHUNK_TERMINAL, inputs_key, settle, stop_chunks
from app.jobs.dispatch import Dispatcher
from app.jobs.service import check_inputs
from app.jobs.tables import Job
from app.platform.filestore import FileStore
from app.platform.orm import owned
from app.platform.settings import Settings
from app.repository.registry import ModelRepository
from app.runtime.datatypes import V2_TO_NUMPY
from app.runtime.tensors import pack, pack_header
from app.tenancy.quotas import Quotas
from app.webhooks.ssrf import UnsafeUrl, check_url, networks

logger = logging.getLogger(__name__)

SPLIT_TASK = "batches.split"
BATCH_EVENTS = ("batch.succeeded", "batch.partially_succeeded", "batch.failed", "batch.cancelled")


def create(
    session: Session,
    store: FileStore,
    repository: ModelRepository,
    settings: Settings,
    tenant_id: int,
    model: str,
    version: str | None,
    *,
    inputs: Any = None,
    file_id: uuid.UUID | None = None,
    webhook: dict[str, Any] | None = None,
    tenant: str | None = None,
    quotas: Quotas | None = None,
    admission: Admission | None = None,
) -> Batch:
    """A batch of inline `inputs` (cut into chunks now) or of an uploaded file
    (checked at its start now, cut by a worker). Rows that do not fit the
    model are a 422 here; in a file, past its first rows, they fail the batch.
    The caller commits, then sends the split (a file) or wakes the model (rows)."""
    card = repository.resolve(model, version, tenant)
    if (inputs is None) == (file_id is None):
        raise InvalidRequest(
            "send either `inputs` (rows, as in a job) or `file_id` (an uploaded file)",
            errors={"inputs": ["exactly one of inputs and file_id"]},
        )
    if webhook is not None:
        try:
            check_url(
                webhook["url"],
                allow_private=settings.webhook_allow_private_networks,
                allowed=networks(settings.webhook_allowed_networks),
            )
        except UnsafeUrl as exc:
            raise InvalidRequest(str(exc), errors={"webhook": {"url": [str(exc)]}}) from None
    batch = new_batch(card, settings, tenant_id, webhook)
    if file_id is not None:
        attach_file(session, store, batch, card, file_id)
        if quotas is not None:  # its rows are counted once it is cut
            quotas.admit_batch(session, tenant_id, None, 1)
        if admission is not None:
            admission.admit(session, card.name)
        session.add(batch)
        session.flush()
        return batch
    arrays = check_inputs(card, inputs)
    total = len(next(iter(arrays.values())))
    if quotas is not None:
        quotas.admit_batch(session, tenant_id, total, math.ceil(total / batch.chunk_rows))
    if admission is not None:
        admission.admit(session, card.name, math.ceil(total / batch.chunk_rows))
    batch.status, batch.rows, batch.split_rows = "running", total, total
    batch.chunks, batch.started_at = math.ceil(total / batch.chunk_rows), datetime.now(UTC)
    session.add(batch)
    session.flush()
    for start in range(0, total, batch.chunk_rows):
        part = {name: array[start : start + batch.chunk_rows] for name, array in arrays.items()}
        _insert_chunk(session, batch, start // batch.chunk_rows, start, part)
    return batch


def new_batch(
    card: ModelCard, settings: Settings, tenant_id: int, webhook: dict[str, Any] | None = None
) -> Batch:
    """A queued batch of `card`'s model, not yet added to a session."""
    if card.batching.max_batch_size <= 0:
        raise InvalidRequest(
            f"model {card.ref} has no batch dimension (max_batch_size 0): send its rows as jobs",
            errors={"model": ["a model whose inputs have a batch dimension"]},
        )
    return Batch(
        id=uuid.uuid4(), tenant_id=tenant_id, model=card.name, model_version=card.version,
        status="queued", chunk_rows=chunk_rows(card, settings), split_rows=0,
        max_attempts=int(card.extra.get("max_attempts", settings.job_max_attempts)),
        webhook_url=webhook["url"] if webhook else None,
        webhook_events=list(webhook["events"]) if webhook else None,
    )  # fmt: skip


def attach_file(
    session: Session, store: FileStore, batch: Batch, card: ModelCard, file_id: uuid.UUID
) -> None:
    """Make `file_id` the batch's input once its first rows fit the model (422 if not)."""
    file = files.get(session, batch.tenant_id, file_id)
    try:
        if file.format == "parquet":
            with _opened(store, file) as source:
                next(parquet.chunks(card, source, 16), None)
        else:
            next(readers.chunks(card, file.format,
                                _complete_rows(file.format, files.head(session, store, file)),
                                16), None)  # fmt: skip
    except readers.BadRows as exc:
        raise InputsDoNotFit(
            f"the file does not fit model {card.ref}: {exc}",
            errors=exc.errors or {"file": str(exc)},
            expected=[spec.to_dict() for spec in card.inputs],
        ) from None
    batch.input_file_id = file.id


def _opened(store: FileStore, file: File) -> IO[bytes]:
    """A Parquet upload, seekable (Parquet files came with the store: never in PostgreSQL)."""
    if file.store_key is None:
        raise readers.BadRows(0, "the file has no bytes in the file store")
    return store.open(file.store_key)


def start_split(dispatcher: Dispatcher, batch_id: uuid.UUID) -> bool:
    """Ask a worker to cut the batch's file; False if the broker refused."""
    return dispatcher.send(SPLIT_TASK, str(batch_id))


def chunk_rows(card: ModelCard, settings: Settings) -> int:
    """Rows per chunk job: a card may set its own (`batch_chunk_rows`); else
    BATCH_CHUNK_ROWS, fewer where a row is large, so a chunk's inputs stay within
    BATCH_CHUNK_BYTES (a worker holds a chunk's inputs and outputs at once)."""
    if "batch_chunk_rows" in card.extra:
        return max(1, int(card.extra["batch_chunk_rows"]))
    row = row_bytes(card)
    fitting = settings.batch_chunk_bytes // row if row else settings.batch_chunk_rows
    return max(1, min(settings.batch_chunk_rows, fitting))


def row_bytes(card: ModelCard) -> int | None:
    """Bytes of one row of the card's inputs; None when a size is not fixed (text,
    or a dimension besides the batch one that is free)."""
    total = 0
    for spec in card.inputs:
        dims = spec.shape[1:] if card.batching.max_batch_size > 0 else spec.shape
        if spec.datatype == "BYTES" or spec.datatype not in V2_TO_NUMPY or min(dims, default=0) < 0:
            return None
        total += math.prod(dims) * V2_TO_NUMPY[spec.datatype].itemsize
    return total or None


def session_factory(session: Session) -> sessionmaker[Session]:
    """Short sessions on the same engine as `session` (reads that hold nothing)."""
    return sessionmaker(bind=session.get_bind(), expire_on_commit=False)


def _complete_rows(fmt: str, part: bytes) -> list[bytes]:
    """The part without a line cut at its end (text formats), so a check of the
    first rows does not trip over half a line."""
    if fmt == "npy" or b"\n" not in part:
        return [part]
    return [part[: part.rindex(b"\n") + 1]]


def _insert_chunk(
    session: Session, batch: Batch, index: int, first_row: int, arrays: dict[str, np.ndarray]
) -> None:
    rows = len(next(iter(arrays.values())))
    session.execute(insert(Job).values(_chunk(batch, index, first_row, rows, pack(arrays))))


def _chunk(
    batch: Batch, index: int, first_row: int, rows: int, data: bytes | None
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(), "tenant_id": batch.tenant_id, "model": batch.model,
        "model_version": batch.model_version, "status": "queued", "input_data": data,
        "batch_rows": rows, "attempts": 0, "max_attempts": batch.max_attempts,
        "batch_id": batch.id, "batch_index": index, "first_row": first_row,
    }  # fmt: skip


@dataclass(frozen=True)
class _InPlace:
    """An .npy whose rows are already laid out as the model's one input wants."""

    input: str
    datatype: str
    data_offset: int
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return V2_TO_NUMPY[self.datatype].itemsize * math.prod(self.shape[1:])


def _in_place(session: Session, store: FileStore, card: ModelCard, file: File) -> _InPlace | None:
    """How to read the file's rows in place, or None when they need converting
    (another dtype, several inputs, text, Fortran order): then they are copied."""
    if file.format != "npy" or len(card.inputs) != 1:
        return None
    spec = card.inputs[0]
    wanted = V2_TO_NUMPY.get(spec.datatype)
    if wanted is None or wanted.hasobject:
        return None
    stream = io.BytesIO(files.head(session, store, file))
    try:
        shape, fortran, dtype = readers.npy_header(stream)
    except (ValueError, EOFError):
        return None
    fits = len(shape) == len(spec.shape) and all(
        want < 0 or got == want for got, want in zip(shape[1:], spec.shape[1:], strict=True)
    )
    if fortran or dtype != wanted.newbyteorder("<") or not fits:
        return None
    return _InPlace(spec.name, spec.datatype, stream.tell(), shape)


def _split_in_place(session: Session, batch: Batch, file: File, plan: _InPlace) -> bool:
    """Every remaining chunk in one transaction, each a header and an offset into
    the file: no row is read or copied (workers read and check them)."""
    total, start = plan.shape[0], batch.split_rows
    if not _advance(session, batch.id, start, total):
        return False
    chunks = []
    for first in range(start, total, batch.chunk_rows):
        rows = min(batch.chunk_rows, total - first)
        header = pack_header([(plan.input, plan.datatype, (rows, *plan.shape[1:]))])
        chunk = _chunk(batch, first // batch.chunk_rows, first, rows, header)
        chunk |= {"input_file_id": file.id, "input_key": file.store_key,
                  "input_offset": plan.data_offset + first * plan.row_bytes}  # fmt: skip
        chunks.append(chunk)
    if chunks:
        session.execute(insert(Job), chunks)
    return True


def split(
    session: Session,
    store: FileStore,
    repository: ModelRepository,
    batch_id: uuid.UUID,
    wake: Callable[[str], object],
) -> str:
    """Cut a file batch into chunk jobs, from where an earlier split stopped. Rows
    an .npy holds as the model wants stay where they are (every chunk an offset
    into the file, one transaction); others are checked and written to the store
    as each chunk's own inputs, a transaction per chunk. Returns what happened,
    for the task's log."""
    batch = session.get(Batch, batch_id)
    session.commit()  # one transaction per chunk from here on (each says so)
    if batch is None or batch.status != "queued" or batch.cancel_requested_at is not None:
        return "nothing to split"
    try:
        card = repository.resolve_rescanning(batch.model, batch.model_version)
        if batch.input_file_id is None:
            raise readers.BadRows(batch.split_rows, "its input file was deleted")
        file = files.get(session, batch.tenant_id, batch.input_file_id)
        plan = _in_place(session, store, card, file)
        if plan is not None:
            if not _split_in_place(session, batch, file, plan):
                session.rollback()
                return "stopped: cancelled, or split elsewhere"
            session.commit()
            wake(batch.model)
            row = plan.shape[0]
            index = math.ceil(row / batch.chunk_rows)
        else:
            index, row = batch.split_rows // batch.chunk_rows, batch.split_rows
            with ExitStack() as held:
                for arrays in _file_chunks(session, store, held, card, file, batch, row):
                    n = len(next(iter(arrays.values())))
                    key = inputs_key(batch.id, index)
                    store.write(key, pack(arrays))  # the same key again if this split resumes
                    if not _advance(session, batch.id, row, row + n):
                        session.rollback()
                        return "stopped: cancelled, or split elsewhere"
                    chunk = _chunk(batch, index, row, n, None) | {"input_key": key}
                    session.execute(insert(Job).values(chunk))
                    session.commit()
                    wake(batch.model)
                    index, row = index + 1, row + n
    except (readers.BadRows, UnknownModel) as exc:
        session.rollback()
        code = "model_unavailable" if isinstance(exc, UnknownModel) else "invalid_input"
        _fail(session, batch.id, code, str(exc))
        return f"failed: {exc}"
    started = session.execute(
        text("UPDATE batches SET status = 'running', rows = :rows, chunks = :chunks, "
             "started_at = coalesce(started_at, now()), split_at = now() "
             "WHERE id = :id AND status = 'queued' AND split_rows = :rows RETURNING id"),
        {"id": batch.id, "rows": row, "chunks": index},
    ).scalar()  # fmt: skip
    session.commit()
    settle(session, [batch.id])
    session.commit()
    return f"split {row} rows into {index} chunks" if started else "split elsewhere"


def _file_chunks(
    session: Session,
    store: FileStore,
    held: ExitStack,
    card: ModelCard,
    file: File,
    batch: Batch,
    skip_rows: int,
) -> Iterator[dict[str, np.ndarray]]:
    """The file's rows from `skip_rows`, checked, `batch.chunk_rows` at a time."""
    if file.format == "parquet":
        source = held.enter_context(_opened(store, file))
        return parquet.chunks(card, source, batch.chunk_rows, skip_rows=skip_rows)
    parts = files.parts(session_factory(session), store, file)
    return readers.chunks(card, file.format, parts, batch.chunk_rows, skip_rows=skip_rows)


def _advance(session: Session, batch_id: uuid.UUID, old: int, new: int) -> bool:
    """Claim rows [old, new) for a chunk. It locks the batch row until commit, so a
    cancel waits for the chunk and then sees it; a second splitter finds the
    count moved on."""
    moved = session.execute(
        text("UPDATE batches SET split_rows = :new, split_at = now(), "
             "started_at = coalesce(started_at, now()) "
             "WHERE id = :id AND status = 'queued' AND split_rows = :old "
             "AND cancel_requested_at IS NULL RETURNING id"),
        {"id": batch_id, "old": old, "new": new},
    ).scalar()  # fmt: skip
    return moved is not None


def _fail(session: Session, batch_id: uuid.UUID, code: str, message: str) -> None:
    """The batch cannot go on: stop its chunks and finish it failed."""
    session.execute(
        text("UPDATE batches SET error_code = :code, error_message = :message, "
             "cancel_requested_at = coalesce(cancel_requested_at, now()) WHERE id = :id"),
        {"id": batch_id, "code": code, "message": message[:2000]},
    )  # fmt: skip
    stop_chunks(session, batch_id)
    session.commit()
    settle(session, [batch_id])
    session.commit()


def sweep(session: Session, settings: Settings, start_split: Callable[[uuid.UUID], bool]) -> int:
    """Finish batches whose last chunk ended where no settle followed (a lease or
    deadline sweep, a worker that died after its commit), and send the split
    again for file batches whose splitter stopped. Returns batches touched."""
    open_ids = list(session.scalars(
        select(Batch.id).where(Batch.status == "running").order_by(Batch.created_at).limit(500)
    ))  # fmt: skip
    finished = settle(session, open_ids)
    session.commit()
    stale = list(session.scalars(
        select(Batch.id).where(
            Batch.status == "queued", Batch.cancel_requested_at.is_(None),
            text("coalesce(split_at, created_at) < now() - make_interval(secs => :age)"),
        ).limit(100),
        {"age": settings.republish_after_seconds},
    ))  # fmt: skip
    session.commit()
    for batch_id in stale:
        start_split(batch_id)
    return len(finished) + len(stale)


def cancel(session: Session, tenant_id: int, batch_id: uuid.UUID) -> Batch:
    """Stop a batch: queued chunks (and the rest of its split) at once, running
    ones when they finish. Chunks already done keep their results."""
    batch = get(session, tenant_id, batch_id)
    if batch.status in BATCH_TERMINAL_STATUSES:
        raise Conflict(f"batch {batch_id} is already {batch.status}", batch_status=batch.status)
    session.execute(
        text("UPDATE batches SET cancel_requested_at = coalesce(cancel_requested_at, now()) "
             "WHERE id = :id"),
        {"id": batch_id},
    )  # fmt: skip
    stop_chunks(session, batch_id)
    session.commit()
    settle(session, [batch_id])
    session.commit()
    session.refresh(batch)
    return batch


def get(session: Session, tenant_id: int, batch_id: uuid.UUID) -> Batch:
    return owned(session, Batch, tenant_id, batch_id, "batch")


def list_batches(session: Session, tenant_id: int, limit: int) -> list[Batch]:
    query = (
        select(Batch)
        .where(Batch.tenant_id == tenant_id)
        .order_by(Batch.created_at.desc(), Batch.id.desc())
        .limit(limit)
    )
    return list(session.scalars(query))


@dataclass
class Progress:
    rows_done: int
    rows_failed: int
    rows_pending: int
    chunks: dict[str, int]
    failed_rows: list[dict[str, Any]]  # {first, last, status, error} ranges, merged
    eta_seconds: float | None


MAX_RANGES = 100


def progress(session: Session, batch: Batch) -> Progress:
    """Counted from the chunks: one indexed aggregate, whatever the batch's size."""
    counts = session.execute(
        text("SELECT status, count(*) AS chunks, coalesce(sum(batch_rows), 0) AS rows "
             "FROM jobs WHERE batch_id = :id GROUP BY status"),
        {"id": batch.id},
    ).all()  # fmt: skip
    chunks = {r.status: r.chunks for r in counts}
    rows = {r.status: int(r.rows) for r in counts}
    done = rows.get("succeeded", 0)
    failed = sum(rows.get(s, 0) for s in ("failed", "cancelled", "expired"))
    ranges: list[dict[str, Any]] = []
    if failed:
        bad = session.execute(
            text("SELECT first_row, batch_rows, status, error_code FROM jobs "
                 f"WHERE batch_id = :id AND status IN {CHUNK_TERMINAL} AND status <> 'succeeded' "
                 "ORDER BY batch_index LIMIT :limit"),
            {"id": batch.id, "limit": MAX_RANGES * 4},
        ).all()  # fmt: skip
        ranges = _merged(bad)[:MAX_RANGES]
    total = batch.rows if batch.rows is not None else None
    pending = (total - done - failed) if total is not None else sum(rows.values()) - done - failed
    return Progress(done, failed, pending, chunks, ranges, _eta(batch, done + failed, pending))


def _merged(chunks: Sequence[Any]) -> list[dict[str, Any]]:
    ranges: list[dict[str, Any]] = []
    for c in chunks:
        last = c.first_row + c.batch_rows - 1
        if (
            ranges
            and ranges[-1]["last"] + 1 == c.first_row
            and ranges[-1]["status"] == c.status
            and ranges[-1]["error"] == c.error_code
        ):
            ranges[-1]["last"] = last
        else:
            ranges.append(
                {"first": c.first_row, "last": last, "status": c.status, "error": c.error_code}
            )
    return ranges


def _eta(batch: Batch, finished: int, pending: int) -> float | None:
    if batch.status != "running" or batch.started_at is None or not finished or pending <= 0:
        return 0.0 if batch.status in BATCH_TERMINAL_STATUSES else None
    elapsed = (datetime.now(UTC) - batch.started_at).total_seconds()
    return round(pending * elapsed / finished, 1)
