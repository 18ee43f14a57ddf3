"""Parquet in and out, by row groups: neither a large input nor a large result
is ever held whole.

In: a column per model input; a row is a list of the input's values (any list
type, every row as long as the input's shape says), or one number for an input
of one value, or a string for a text input. Row groups larger than
MAX_ROW_GROUP_BYTES (uncompressed, as the footer declares) are refused before
any is read, so a file made to blow memory is a 422, not a dead worker.
Out: a column per output, a row group per chunk of the batch.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from app.batches.readers import Arrays, BadRows, checked
from app.cards import ModelCard, TensorSpec

PARQUET = "application/vnd.apache.parquet"
MAX_ROW_GROUP_BYTES = 256 * 1024 * 1024


def chunks(
    card: ModelCard, source: IO[bytes], chunk_rows: int, *, skip_rows: int = 0
) -> Iterator[Arrays]:
    """Checked arrays of `chunk_rows` rows (the last may be shorter), starting
    after `skip_rows` rows."""
    names = [spec.name for spec in card.inputs]
    parquet = _open(card, source)
    row, pending, held = 0, list[pa.RecordBatch](), 0  # row: the first row pending holds
    for batch in parquet.iter_batches(batch_size=chunk_rows, columns=names):
        if row < skip_rows:
            skipped = min(batch.num_rows, skip_rows - row)
            batch, row = batch.slice(skipped), row + skipped
        pending.append(batch)
        held += batch.num_rows
        while held >= chunk_rows:
            table = pa.Table.from_batches(pending)
            yield checked(card, row, _arrays(card, table.slice(0, chunk_rows), row))
            rest = table.slice(chunk_rows)
            pending, held, row = rest.to_batches(), rest.num_rows, row + chunk_rows
    if held:
        yield checked(card, row, _arrays(card, pa.Table.from_batches(pending), row))


def _open(card: ModelCard, source: IO[bytes]) -> pq.ParquetFile:
    """The file, once its columns, their types and its row groups are what the model needs."""
    try:
        parquet = pq.ParquetFile(source)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise BadRows(0, f"not a readable Parquet file ({exc})") from None
    schema = parquet.schema_arrow
    expected = {spec.name: _expected(spec) for spec in card.inputs}
    missing = [name for name in expected if name not in schema.names]
    if missing:
        raise BadRows(
            0,
            f"the Parquet file has no column {', '.join(missing)}; it has "
            f"{', '.join(schema.names) or 'none'}, expected a column per model input",
            {name: expected[name] for name in missing},
        )
    for spec in card.inputs:
        kind = schema.field(spec.name).type
        value = kind.value_type if _is_list(kind) else kind
        fits = (
            pa.types.is_string(value)
            or pa.types.is_large_string(value)
            or pa.types.is_binary(value)
            or pa.types.is_large_binary(value)
            if spec.datatype == "BYTES"
            else pa.types.is_integer(value)
            or pa.types.is_floating(value)
            or pa.types.is_boolean(value)
        )
        if not fits or (not _is_list(kind) and _width(spec) != 1):
            raise BadRows(0, f"column {spec.name} is {kind}; expected {expected[spec.name]}",
                          {spec.name: expected[spec.name]})  # fmt: skip
    for index in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(index).total_byte_size
        if size > MAX_ROW_GROUP_BYTES:
            raise BadRows(
                0,
                f"row group {index} holds {size} bytes; write the file with row groups of "
                f"at most {MAX_ROW_GROUP_BYTES} bytes (e.g. row_group_size in pyarrow)",
            )
    return parquet


def _expected(spec: TensorSpec) -> str:
    width = _width(spec)
    what = "strings" if spec.datatype == "BYTES" else f"numbers ({spec.datatype})"
    if width == 1:
        return f"one of {what} per row, or a list of 1"
    return f"a list of {width if width > 0 else 'N'} {what} per row"


def _width(spec: TensorSpec) -> int:
    """Values per row; -1 where a dimension is free."""
    dims = list(spec.shape[1:])
    return -1 if any(d < 0 for d in dims) else math.prod(dims)


def _is_list(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


def _arrays(card: ModelCard, table: pa.Table, first_row: int) -> dict[str, Any]:
    return {spec.name: _column(spec, table.column(spec.name), first_row) for spec in card.inputs}


def _column(spec: TensorSpec, column: pa.ChunkedArray, first_row: int) -> Any:
    values = column.combine_chunks()
    if values.null_count:
        raise BadRows(first_row + _first(values.is_null()),
                      f"has no value in column {spec.name}")  # fmt: skip
    if not _is_list(values.type):
        if spec.datatype == "BYTES":
            return values.to_pylist()
        flat = values.to_numpy(zero_copy_only=False)
        return flat.reshape(len(flat), *([1] * (len(spec.shape) - 1)))
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
    width = _width(spec)
    wanted = width if width >= 0 else int(lengths[0]) if len(lengths) else 0
    wrong = np.flatnonzero(lengths != wanted)
    if len(wrong):
        index = int(wrong[0])
        raise BadRows(
            first_row + index,
            f"has {lengths[index]} values in column {spec.name}; expected {wanted}",
            {spec.name: _expected(spec)},
        )
    inner = values.flatten()
    if inner.null_count:
        raise BadRows(first_row, f"has a missing value in a list of column {spec.name}")
    if spec.datatype == "BYTES":
        items = inner.to_pylist()
        return [items[i * wanted : (i + 1) * wanted] for i in range(len(values))]
    flat = inner.to_numpy(zero_copy_only=False)
    dims = [d if d >= 0 else -1 for d in spec.shape[1:]] if width >= 0 else [wanted]
    return flat.reshape(len(values), *dims)


def _first(mask: pa.BooleanArray) -> int:
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


class _Sink(io.RawIOBase):
    """Where the writer puts its bytes, handed on as soon as a row group is written."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        piece = bytes(data)
        self.parts.append(piece)
        self.written += len(piece)
        return len(piece)

    def tell(self) -> int:
        return self.written

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


def write(names: list[str], parts: Iterable[Arrays], empty: pa.Schema) -> Iterator[bytes]:
    """A Parquet file of these outputs, a row group per part, yielded as written;
    `empty` is the schema of a result without rows."""
    sink, writer = _Sink(), None
    for arrays in parts:
        table = pa.table({name: _to_arrow(arrays[name]) for name in names})
        if writer is None:
            writer = pq.ParquetWriter(sink, table.schema)
        writer.write_table(table)
        yield sink.take()
    if writer is None:
        writer = pq.ParquetWriter(sink, empty)
    writer.close()
    yield sink.take()


def _as_bytes(item: str | bytes) -> bytes:
    return item.encode() if isinstance(item, str) else item


def _to_arrow(array: np.ndarray) -> pa.Array:
    """A flat column for one value a row, else a fixed-size list of the row's values."""
    if array.dtype.kind in "OUS":
        if array.dtype == object and any(isinstance(item, bytes) for item in array.flat):
            # Bytes that are not text (an image a model made): a binary column.
            array = np.vectorize(_as_bytes, otypes=[object])(array)
        return pa.array(array.reshape(len(array), -1).tolist() if array.ndim > 1 else array)
    if array.ndim == 1:
        return pa.array(array)
    width = math.prod(array.shape[1:])
    values = pa.array(np.ascontiguousarray(array).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(values, width)
