"""New batches: one model's rows, cut into chunk jobs.

A chunk is an ordinary job (`jobs.batch_id`), so workers claim, lease, retry and
dead-letter it like any other, through the one job-running path; a row is never
a job of its own (but for a generative model's, whose chunks are a row each: see
`chunk_rows`). Inline rows are cut when the batch is made; a file's start is
checked then, and the file is cut by a worker (app.batches.splitting). Nothing
here commits: the batch operations own the transaction.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import numpy as np
from sqlalchemy import insert
from sqlalchemy.orm import Session

from app.batches import files, openai_format, parquet, readers
from app.batches.tables import Batch, File
from app.cards import ModelCard
from app.errors import InputsDoNotFit, InvalidRequest
from app.jobs.tables import Job
from app.platform.filestore import FileStore
from app.platform.settings import Settings
from app.runtime.datatypes import V2_TO_NUMPY
from app.runtime.tensors import pack
from app.statuses import BatchStatus, JobStatus

SPLIT_TASK = "batches.split"
BATCH_EVENTS = ("batch.succeeded", "batch.partially_succeeded", "batch.failed", "batch.cancelled")


@dataclass(frozen=True)
class Chunking:
    """How batches are cut: BATCH_CHUNK_ROWS rows a chunk at most, fewer where a
    row is large (BATCH_CHUNK_BYTES of inputs a chunk), and each chunk's attempt
    cap (JOB_MAX_ATTEMPTS, unless the card sets one)."""

    rows: int
    bytes: int
    max_attempts: int

    @classmethod
    def of(cls, settings: Settings) -> Chunking:
        return cls(settings.batch_chunk_rows, settings.batch_chunk_bytes,
                   settings.job_max_attempts)  # fmt: skip


def new_batch(
    card: ModelCard, chunking: Chunking, tenant_id: int, webhook: dict[str, Any] | None = None
) -> Batch:
    """A queued batch of `card`'s model, not yet added to a session."""
    if card.batching.max_batch_size <= 0 and card.generation is None:
        raise InvalidRequest(
            f"model {card.ref} has no batch dimension (max_batch_size 0): send its rows as jobs",
            errors={"model": ["a model whose inputs have a batch dimension"]},
        )
    return Batch(
        id=uuid.uuid4(), tenant_id=tenant_id, model=card.name, model_version=card.version,
        status=BatchStatus.QUEUED, chunk_rows=chunk_rows(card, chunking), split_rows=0,
        max_attempts=int(card.extra.get("max_attempts", chunking.max_attempts)),
        webhook_url=webhook["url"] if webhook else None,
        webhook_events=list(webhook["events"]) if webhook else None,
    )  # fmt: skip


def add_rows(session: Session, batch: Batch, arrays: dict[str, np.ndarray]) -> None:
    """Inline rows (checked against the card): the batch is running at once, a
    chunk job for each `chunk_rows` of them, queued."""
    total = len(next(iter(arrays.values())))
    batch.status, batch.rows, batch.split_rows = BatchStatus.RUNNING, total, total
    batch.chunks, batch.started_at = chunks_of(batch, total), datetime.now(UTC)
    session.add(batch)
    session.flush()
    for start in range(0, total, batch.chunk_rows):
        part = {name: array[start : start + batch.chunk_rows] for name, array in arrays.items()}
        _insert_chunk(session, batch, start // batch.chunk_rows, start, part)


def chunks_of(batch: Batch, rows: int) -> int:
    return math.ceil(rows / batch.chunk_rows)


def attach_file(
    session: Session, store: FileStore, batch: Batch, card: ModelCard, file_id: uuid.UUID
) -> None:
    """Make `file_id` the batch's input once its first rows fit the model (422 if not)."""
    file = files.get(session, batch.tenant_id, file_id)
    try:
        if batch.openai is not None:  # its lines are refused one by one, as they are cut
            openai_format.check_head(card, files.head(session, store, file))
        elif card.generation is not None and file.format != "jsonl":
            raise readers.BadRows(0, f"model {card.ref} generates: its batch file is .jsonl, "
                                     "a request a line, not ." + file.format)  # fmt: skip
        elif file.format == "parquet":
            with opened(store, file) as source:
                next(parquet.chunks(card, source, 16), None)
        else:
            next(readers.chunks(card, file.format,
                                complete_rows(file.format, files.head(session, store, file)),
                                16), None)  # fmt: skip
    except readers.BadRows as exc:
        raise InputsDoNotFit(
            f"the file does not fit model {card.ref}: {exc}",
            errors=exc.errors or {"file": str(exc)},
            expected=[spec.to_dict() for spec in card.inputs],
        ) from None
    batch.input_file_id = file.id


def opened(store: FileStore, file: File) -> IO[bytes]:
    """A Parquet upload, seekable (Parquet files came with the store: never in PostgreSQL)."""
    if file.store_key is None:
        raise readers.BadRows(0, "the file has no bytes in the file store")
    return store.open(file.store_key)


def chunk_rows(card: ModelCard, chunking: Chunking) -> int:
    """Rows per chunk job: a card may set its own (`batch_chunk_rows`); else
    BATCH_CHUNK_ROWS, fewer where a row is large, so a chunk's inputs stay within
    BATCH_CHUNK_BYTES (a worker holds a chunk's inputs and outputs at once). A
    generative model's chunk is one row: a generation runs for seconds to minutes,
    worth a lease, a retry, a cancel and a token stream of its own, and the
    decode loop batches the rows of every chunk as it batches jobs."""
    if card.generation is not None:
        return 1
    if "batch_chunk_rows" in card.extra:
        return max(1, int(card.extra["batch_chunk_rows"]))
    row = row_bytes(card)
    fitting = chunking.bytes // row if row else chunking.rows
    return max(1, min(chunking.rows, fitting))


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


def complete_rows(fmt: str, part: bytes) -> list[bytes]:
    """The part without a line cut at its end (text formats), so a check of the
    first rows does not trip over half a line."""
    if fmt == "npy" or b"\n" not in part:
        return [part]
    return [part[: part.rindex(b"\n") + 1]]


def _insert_chunk(
    session: Session, batch: Batch, index: int, first_row: int, arrays: dict[str, np.ndarray]
) -> None:
    rows = len(next(iter(arrays.values())))
    session.execute(insert(Job).values(chunk_values(batch, index, first_row, rows, pack(arrays))))


def chunk_values(
    batch: Batch, index: int, first_row: int, rows: int, data: bytes | None
) -> dict[str, Any]:
    """A chunk job's columns: rows [first_row, first_row + rows) of the batch."""
    return {
        "id": uuid.uuid4(), "tenant_id": batch.tenant_id, "model": batch.model,
        "model_version": batch.model_version, "status": JobStatus.QUEUED, "input_data": data,
        "batch_rows": rows, "attempts": 0, "max_attempts": batch.max_attempts,
        "batch_id": batch.id, "batch_index": index, "first_row": first_row,
    }  # fmt: skip
