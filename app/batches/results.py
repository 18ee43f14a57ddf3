"""A finished batch's outputs, streamed in input order from its chunks.

Chunks are listed a few at a time in short sessions (no connection is held
while a slow client reads) and each chunk's part is read from the file store
only when its turn comes (chunks finished before the store hold theirs in
PostgreSQL), so neither the API's memory nor a transaction grows with the
batch. JSONL gives every row, with its error where its chunk failed; `.npy`
and Parquet need every row to have succeeded (the first has no place for a
missing row; for the second, read its errors as JSONL) and `.npy` holds one
output, or a structured array of all of them.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.batches import parquet
from app.batches.tables import Batch
from app.cards import ModelCard
from app.errors import Conflict, InvalidRequest
from app.jobs.chunks import result_key
from app.jobs.tables import Job
from app.platform.filestore import FileStore
from app.runtime.datatypes import V2_TO_NUMPY, json_values
from app.runtime.tensors import to_json, unpack
from app.statuses import BATCH_OPEN, JobStatus

NPY = "application/x-npy"
JSONL = "application/jsonl"
PARQUET = parquet.PARQUET
WHOLE = (NPY, PARQUET)  # formats that need every row
_PER_QUERY = 8


@dataclass(frozen=True)
class Chunk:
    first_row: int
    rows: int
    status: str
    error_code: str | None
    error_message: str | None
    output_data: bytes | None
    job_id: uuid.UUID | None = None
    finished_at: datetime | None = None
    batch_line: dict[str, Any] | None = None  # a line of a batch in OpenAI's format


def chunks(
    sessions: sessionmaker[Session], store: FileStore, batch_id: uuid.UUID
) -> Iterator[Chunk]:
    index = 0
    while True:
        with sessions() as session:
            query = (
                select(Job.batch_index, Job.first_row, Job.batch_rows, Job.status, Job.error_code,
                       Job.error_message, Job.output_data, Job.output_bytes, Job.id,
                       Job.finished_at, Job.batch_line)
                .where(Job.batch_id == batch_id, Job.batch_index >= index)
                .order_by(Job.batch_index)
                .limit(_PER_QUERY)
            )  # fmt: skip
            rows = session.execute(query).all()
        for r in rows:
            data = r.output_data
            if data is None and r.output_bytes is not None and r.status == JobStatus.SUCCEEDED:
                data = store.read(result_key(batch_id, r.batch_index))
            yield Chunk(r.first_row, r.batch_rows, r.status, r.error_code, r.error_message,
                        data, r.id, r.finished_at, r.batch_line)  # fmt: skip
        if len(rows) < _PER_QUERY:
            return
        index = rows[-1].batch_index + 1


def check_ready(batch: Batch, failed_rows: int, fmt: str) -> None:
    if batch.status in BATCH_OPEN:
        raise Conflict(
            f"batch {batch.id} is still {batch.status}; its results can be read once it "
            "finishes (GET /batches/<id> shows its progress)",
            batch_status=batch.status,
        )
    if batch.purged_at is not None:
        raise Conflict(
            f"the results of batch {batch.id} were deleted by retention (RETENTION_SECONDS "
            "after it finished); run it again to have them",
            batch_status=batch.status,
        )
    if fmt in WHOLE and failed_rows:
        kind = ".npy array" if fmt == NPY else "Parquet file"
        raise Conflict(
            f"batch {batch.id} has {failed_rows} rows without outputs, which an {kind} "
            "cannot leave out; read the results as JSONL (Accept: application/jsonl), where "
            "each failed row carries its error, or see `failed_rows` in GET /batches/<id>",
            batch_status=batch.status,
        )


def jsonl(card: ModelCard, chunks: Iterator[Chunk]) -> Iterator[bytes]:
    """`{"row": i, "outputs": {...}}` per row, or `{"row": i, "error": {...}}`; a
    generative model's outputs are a job's (`text`, `finish_reason`, the tokens),
    its one row's values."""
    if card.generation is not None:
        yield from _generation_jsonl(chunks)
        return
    names = [spec.name for spec in card.outputs]
    for chunk in chunks:
        if chunk.status != JobStatus.SUCCEEDED or chunk.output_data is None:
            error = json.dumps({"code": chunk.error_code or chunk.status,
                                "message": chunk.error_message})  # fmt: skip
            yield "".join(
                f'{{"row": {row}, "error": {error}}}\n'
                for row in range(chunk.first_row, chunk.first_row + chunk.rows)
            ).encode()
            continue
        arrays = unpack(chunk.output_data)
        lists = {name: json_values(arrays[name]) for name in names}
        yield "".join(
            json.dumps({"row": chunk.first_row + i, "outputs": {n: lists[n][i] for n in names}})
            + "\n"
            for i in range(chunk.rows)
        ).encode()


def _generation_jsonl(chunks: Iterator[Chunk]) -> Iterator[bytes]:
    for chunk in chunks:
        if chunk.status != JobStatus.SUCCEEDED or chunk.output_data is None:
            error = {"code": chunk.error_code or chunk.status, "message": chunk.error_message}
            yield (json.dumps({"row": chunk.first_row, "error": error}) + "\n").encode()
            continue
        outputs = to_json(unpack(chunk.output_data))
        yield (json.dumps({"row": chunk.first_row, "outputs": outputs}) + "\n").encode()


def numeric_outputs(card: ModelCard, output: str | None) -> list[str]:
    """The outputs an .npy or Parquet file holds: the one asked for, or all (in an
    .npy, then a structured array)."""
    if card.generation is not None:
        raise InvalidRequest(
            f"model {card.ref} generates text; read its results as JSONL",
            errors={"Accept": [JSONL]},
        )
    specs = list(card.outputs)
    if output is not None:
        specs = [s for s in specs if s.name == output]
        if not specs:
            known = ", ".join(s.name for s in card.outputs)
            raise InvalidRequest(
                f"model {card.ref} has no output {output!r}; its outputs are {known}",
                errors={"output": [f"one of {known}"]},
            )
    if any(s.datatype not in V2_TO_NUMPY for s in specs):
        raise InvalidRequest(
            "an output of this model is not numeric; read the results as JSONL",
            errors={"Accept": [JSONL]},
        )
    return [s.name for s in specs]


def npy(names: list[str], total_rows: int, chunks: Iterator[Chunk]) -> Iterator[bytes]:
    """One .npy array of `total_rows` rows: the header from the first chunk's row
    shapes, then each chunk's bytes in order."""
    dtype: np.dtype | None = None
    for chunk in chunks:
        arrays = _outputs(chunk, names)
        if len(names) > 1:
            fields = [(n, arrays[n].dtype, arrays[n].shape[1:]) for n in names]
            rows = np.empty(chunk.rows, dtype=fields)
            for name in names:
                rows[name] = arrays[name]
        else:
            rows = np.ascontiguousarray(arrays[names[0]])
        if dtype is None:
            dtype = rows.dtype
            yield _header(dtype, (total_rows, *rows.shape[1:]))
        yield rows.tobytes()
    if dtype is None:
        yield _header(np.dtype(np.float32), (0,))


def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    out = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": shape}  # fmt: skip
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def parquet_file(card: ModelCard, names: list[str], chunks: Iterator[Chunk]) -> Iterator[bytes]:
    """A Parquet file with a column per output, a row group per chunk, each written
    (and sent) as its chunk is read."""
    specs = [spec for spec in card.outputs if spec.name in names]
    empty = pa.schema([(s.name, pa.from_numpy_dtype(V2_TO_NUMPY[s.datatype])) for s in specs])
    parts = (_outputs(chunk, names) for chunk in chunks)
    return parquet.write(names, parts, empty)


def _outputs(chunk: Chunk, names: list[str]) -> dict[str, np.ndarray]:
    if chunk.output_data is None:
        raise RuntimeError(f"chunk at row {chunk.first_row} has no outputs")
    arrays = unpack(chunk.output_data)
    return {name: arrays[name] for name in names}
