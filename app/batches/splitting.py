"""Cutting a file batch into chunk jobs, from where an earlier cut stopped.

Rows an .npy holds as the model wants stay where they are (every chunk an offset
into the file, in one step); others are checked and written to the store as each
chunk's own inputs, a step a chunk. Each step claims its rows on the batch row
first (`advance`), so a cancel waits for the chunk and then sees it, and a
second splitter finds the count moved on. The batch operations run each step as
a unit of work and wake the model after each; nothing here commits.
"""

from __future__ import annotations

import io
import math
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.batches import files, openai_format, parquet, readers
from app.batches.creation import chunk_values, opened
from app.batches.tables import Batch, File
from app.cards import ModelCard
from app.jobs.chunks import inputs_key, stop_chunks
from app.jobs.tables import Job
from app.platform.filestore import FileStore
from app.runtime.datatypes import V2_TO_NUMPY
from app.runtime.tensors import pack, pack_header
from app.statuses import BatchStatus

# Rows to cut into a chunk (None: a line refused before it ran), and the chunk
# job's own column values.
Cut = tuple[dict[str, np.ndarray] | None, dict[str, Any]]


@dataclass(frozen=True)
class InPlace:
    """An .npy whose rows are already laid out as the model's one input wants."""

    input: str
    datatype: str
    data_offset: int
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return V2_TO_NUMPY[self.datatype].itemsize * math.prod(self.shape[1:])


def in_place(session: Session, store: FileStore, card: ModelCard, file: File) -> InPlace | None:
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
    return InPlace(spec.name, spec.datatype, stream.tell(), shape)


def split_in_place(session: Session, batch: Batch, file: File, plan: InPlace) -> bool:
    """Every remaining chunk in one transaction, each a header and an offset into
    the file: no row is read or copied (workers read and check them)."""
    total, start = plan.shape[0], batch.split_rows
    if not advance(session, batch.id, start, total):
        return False
    chunks = []
    for first in range(start, total, batch.chunk_rows):
        rows = min(batch.chunk_rows, total - first)
        header = pack_header([(plan.input, plan.datatype, (rows, *plan.shape[1:]))])
        chunk = chunk_values(batch, first // batch.chunk_rows, first, rows, header)
        chunk |= {"input_file_id": file.id, "input_key": file.store_key,
                  "input_offset": plan.data_offset + first * plan.row_bytes}  # fmt: skip
        chunks.append(chunk)
    if chunks:
        session.execute(insert(Job), chunks)
    return True


def file_chunks(
    sessions: sessionmaker[Session],
    store: FileStore,
    held: ExitStack,
    card: ModelCard,
    file: File,
    batch: Batch,
    skip_rows: int,
) -> Iterator[Cut]:
    """The file's rows from `skip_rows`, checked, `batch.chunk_rows` at a time (a file
    kept in PostgreSQL is read in `sessions` of its own: no transaction is held);
    a batch in OpenAI's format, a line at a time, each with its chunk's own columns."""
    if batch.openai is not None:
        lines = openai_format.lines(
            card, batch.openai["endpoint"], lambda: files.parts(sessions, store, file), skip_rows
        )
        return ((line.arrays, line.columns) for line in lines)
    if file.format == "parquet":
        source = held.enter_context(opened(store, file))
        chunks = parquet.chunks(card, source, batch.chunk_rows, skip_rows=skip_rows)
    else:
        parts = files.parts(sessions, store, file)
        chunks = readers.chunks(card, file.format, parts, batch.chunk_rows, skip_rows=skip_rows)
    return ((arrays, {}) for arrays in chunks)


def advance(session: Session, batch_id: uuid.UUID, old: int, new: int) -> bool:
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


def fail(session: Session, batch_id: uuid.UUID, code: str, message: str) -> None:
    """The batch cannot go on: stop its chunks; it finishes failed once settled
    (app.jobs.chunks.settle, after the commit)."""
    session.execute(
        text("UPDATE batches SET error_code = :code, error_message = :message, "
             "cancel_requested_at = coalesce(cancel_requested_at, now()) WHERE id = :id"),
        {"id": batch_id, "code": code, "message": message[:2000]},
    )  # fmt: skip
    stop_chunks(session, batch_id)


def cut_rows(cut: Cut) -> int:
    arrays = cut[0]
    return 1 if arrays is None else len(next(iter(arrays.values())))


def cut_chunk(
    session: Session, store: FileStore, batch: Batch, place: tuple[int, int], cut: Cut,
    inline: bool = False,
) -> bool:  # fmt: skip
    """Chunk `index` of the batch, from row `row` (`place`), its rows written to the
    store as its own inputs (the same key again if this split resumes), or kept
    in the job row with `inline` (a generation's one request: an object in the
    store for each would cost more than the row), with the cut's own columns (a
    line refused before it ran has no rows: its chunk is born failed); False when
    the batch was cancelled or is being split elsewhere (nothing written)."""
    (index, row), (arrays, columns) = place, cut
    n = cut_rows(cut)
    if inline or arrays is None:
        if not advance(session, batch.id, row, row + n):
            return False
        data = None if arrays is None else pack(arrays)
        session.execute(insert(Job).values(chunk_values(batch, index, row, n, data) | columns))
        return True
    key = inputs_key(batch.id, index)
    store.write(key, pack(arrays))
    if not advance(session, batch.id, row, row + n):
        return False
    values = chunk_values(batch, index, row, n, None) | {"input_key": key} | columns
    session.execute(insert(Job).values(values))
    return True


_SPLIT = text(
    "UPDATE batches SET status = 'running', rows = :rows, chunks = :chunks, "
    "started_at = coalesce(started_at, now()), split_at = now() "
    "WHERE id = :id AND status = 'queued' AND split_rows = :rows RETURNING id"
)


def mark_split(session: Session, batch_id: uuid.UUID, rows: int, chunks: int) -> bool:
    """Every row is in a chunk: the batch runs. False if another splitter did it."""
    params = {"id": batch_id, "rows": rows, "chunks": chunks}
    return session.execute(_SPLIT, params).scalar() is not None


def stale(session: Session, older_than_s: float, limit: int = 100) -> list[uuid.UUID]:
    """File batches whose splitter stopped (nothing cut for `older_than_s`)."""
    return list(session.scalars(
        select(Batch.id).where(
            Batch.status == BatchStatus.QUEUED, Batch.cancel_requested_at.is_(None),
            text("coalesce(split_at, created_at) < now() - make_interval(secs => :age)"),
        ).limit(limit),
        {"age": older_than_s},
    ))  # fmt: skip


def open_batches(session: Session, limit: int = 500) -> list[uuid.UUID]:
    """Running batches, oldest first: the sweep settles those whose last chunk ended."""
    query = select(Batch.id).where(Batch.status == BatchStatus.RUNNING)
    return list(session.scalars(query.order_by(Batch.created_at).limit(limit)))
