"""Rows of a batch's input, read from a stream of bytes in chunks of a fixed
number of rows, never the whole file at once.

- `.npy`: one array whose first axis is the rows, for a model with one input
  (or a structured array with a field per input). Read by byte offsets from
  its header; object arrays (pickles) are refused.
- `.jsonl`: one row per line, `{"<input>": <row>}`, or the bare row for a
  model with one input.
- `.csv`: one row per line for a model with one input: its values (a vector
  input) or its one value (a text input). A first line that is not data is a
  header and skipped.
- A generative model's rows are `.jsonl` only: a request per line, as a job's
  body without the model.

Every chunk is checked against the card like a job's inputs, so a bad row is
reported with its row number.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tokenize
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np

from app.cards import ModelCard
from app.runtime.tensors import InvalidInputs, parse_inputs

FORMATS = ("npy", "jsonl", "csv")  # read from a stream of bytes; Parquet: app.batches.parquet
TEXT_BLOCK_ROWS = 4096
Arrays = dict[str, np.ndarray]


class BadRows(ValueError):
    """Rows that do not fit the model; `first_row` is where the problem starts,
    `code` the batch's error code when a split finds them."""

    code = "invalid_input"

    def __init__(self, first_row: int, message: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(f"row {first_row}: {message}")
        self.first_row, self.errors = first_row, errors or {}


def chunks(
    card: ModelCard, fmt: str, parts: Iterable[bytes], chunk_rows: int, *, skip_rows: int = 0
) -> Iterator[Arrays]:
    """Checked arrays of `chunk_rows` rows (the last may be shorter), starting
    after `skip_rows` rows."""
    if card.generation is not None:
        yield from _generation_chunks(card, fmt, iter(parts), chunk_rows, skip_rows)
        return
    readers = {"npy": _npy_rows, "jsonl": _jsonl_rows, "csv": _csv_rows}
    # Text is parsed TEXT_BLOCK_ROWS at a time (its Python objects take some 30
    # times the bytes of the arrays they become), then joined into chunks.
    block = chunk_rows if fmt == "npy" else min(chunk_rows, TEXT_BLOCK_ROWS)
    row = skip_rows
    checked_blocks: list[Arrays] = []
    for raw in readers[fmt](card, iter(parts), block, skip_rows):
        arrays = checked(card, row, raw)
        row += _rows(arrays)
        if block == chunk_rows:
            yield arrays
            continue
        checked_blocks.append(arrays)
        while sum(map(_rows, checked_blocks)) >= chunk_rows:
            chunk, rest = _split(_joined(checked_blocks), chunk_rows)
            checked_blocks = [rest] if _rows(rest) else []
            yield chunk
    if checked_blocks:
        yield _joined(checked_blocks)


def _rows(arrays: Arrays) -> int:
    return len(next(iter(arrays.values())))


def _joined(blocks: list[Arrays]) -> Arrays:
    if len(blocks) == 1:
        return blocks[0]
    return {name: np.concatenate([b[name] for b in blocks]) for name in blocks[0]}


def _split(arrays: Arrays, rows: int) -> tuple[Arrays, Arrays]:
    return {k: v[:rows] for k, v in arrays.items()}, {k: v[rows:] for k, v in arrays.items()}


def checked(card: ModelCard, first_row: int, raw: dict[str, Any]) -> Arrays:
    """Rows from `first_row` checked against the card like a job's inputs."""
    try:
        return parse_inputs(card, raw)
    except InvalidInputs as exc:
        raise BadRows(first_row, str(exc), exc.errors) from None


def _single_input(card: ModelCard, fmt: str) -> str:
    if len(card.inputs) != 1:
        raise BadRows(0, f"a .{fmt} file holds one input; model {card.ref} has several: "
                         "use .jsonl with an object per row")  # fmt: skip
    return card.inputs[0].name


# --- .npy -------------------------------------------------------------------


def npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The shape, Fortran order and dtype an .npy header declares; the stream is
    left at the first byte of data. Nothing is unpickled. numpy's reader takes a
    negative dimension, and a shape of more bytes than an int64 counts (whose row
    size then wraps round): both are a ValueError here, like any bad header, and so is
    the tokenize.TokenError numpy lets out of a header it cannot parse (an unclosed
    bracket), when it tries again with the filter for old (Python 2) headers, and the
    SyntaxError of a dtype it reads as a comma string ('<,4')."""
    version = np.lib.format.read_magic(stream)
    read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
        version, np.lib.format.read_array_header_2_0
    )
    try:
        shape, fortran, dtype = read(stream)
    except (tokenize.TokenError, SyntaxError) as exc:
        raise ValueError(f"the header is not a Python literal ({exc.args[0]})") from None
    if any(d < 0 for d in shape) or math.prod(shape) * dtype.itemsize >= 2**63:
        raise ValueError(f"shape {tuple(shape)} of {dtype} is not one an array can have")
    return tuple(shape), bool(fortran), dtype


def _npy_rows(
    card: ModelCard, parts: Iterator[bytes], chunk_rows: int, skip_rows: int
) -> Iterator[dict[str, Any]]:
    buffer = bytearray()

    def fill(size: int) -> bool:
        while len(buffer) < size:
            part = next(parts, None)
            if part is None:
                return False
            buffer.extend(part)
        return True

    fill(65536)  # the header is in the first few hundred bytes
    header = io.BytesIO(bytes(buffer[:65536]))
    try:
        shape, fortran, dtype = npy_header(header)
    except (ValueError, EOFError) as exc:
        raise BadRows(0, f"not a readable .npy file ({exc})") from None
    if dtype.hasobject:
        raise BadRows(0, ".npy files of Python objects are not accepted (they need pickle)")
    if fortran or not shape:
        raise BadRows(0, ".npy array must be C-ordered with rows along its first axis")
    names = dtype.names or (_single_input(card, "npy"),)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    del buffer[: header.tell()]
    total, row = shape[0], min(skip_rows, shape[0])
    if not fill(row * row_bytes):
        raise BadRows(row, f".npy file ends early: its header promises {total} rows")
    del buffer[: row * row_bytes]
    while row < total:
        n = min(chunk_rows, total - row)
        if not fill(n * row_bytes):
            raise BadRows(row, f".npy file ends early: its header promises {total} rows")
        array = np.frombuffer(bytes(buffer[: n * row_bytes]), dtype=dtype).reshape(n, *shape[1:])
        del buffer[: n * row_bytes]
        row += n
        if dtype.names:
            yield {name: array[name] for name in names}
        else:
            yield {names[0]: array.astype(str) if dtype.kind in "US" else array}


# --- .jsonl and .csv ----------------------------------------------------------


def raw_lines(parts: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(row number, bytes) of each non-blank line, across part boundaries."""
    tail, row = b"", 0
    for part in parts:
        lines = (tail + part).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if line.strip():
                yield row, line
                row += 1
    if tail.strip():
        yield row, tail


def _lines(parts: Iterator[bytes]) -> Iterator[tuple[int, str]]:
    """(row number, line) of each non-blank line, as text."""
    for row, line in raw_lines(parts):
        yield row, _decoded(line, row)


def _decoded(line: bytes, row: int) -> str:
    try:
        return line.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        raise BadRows(row, "is not UTF-8 text") from None


def _gathered(
    rows: Iterator[dict[str, Any]], names: list[str], chunk_rows: int
) -> Iterator[dict[str, Any]]:
    chunk: dict[str, list[Any]] = {name: [] for name in names}
    count = 0
    for values in rows:
        for name in names:
            chunk[name].append(values.get(name))
        count += 1
        if count == chunk_rows:
            yield chunk
            chunk, count = {name: [] for name in names}, 0
    if count:
        yield chunk


def _jsonl_rows(
    card: ModelCard, parts: Iterator[bytes], chunk_rows: int, skip_rows: int
) -> Iterator[dict[str, Any]]:
    names = [spec.name for spec in card.inputs]

    def rows() -> Iterator[dict[str, Any]]:
        for row, line in _lines(parts):
            if row < skip_rows:
                continue
            value = _json(row, line)
            if isinstance(value, dict):
                if missing := [n for n in names if n not in value]:
                    raise BadRows(row, f"has no {', '.join(missing)}; expected keys {names}")
                yield value
            elif len(names) == 1:
                yield {names[0]: value}
            else:
                raise BadRows(row, f"expected an object with keys {names}")

    return _gathered(rows(), names, chunk_rows)


def _json(row: int, line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise BadRows(row, f"is not JSON ({exc})") from None
    except RecursionError:  # json's decoder recurses per level of nesting
        raise BadRows(row, "is not JSON the service reads (nested too deeply)") from None


def _generation_chunks(
    card: ModelCard, fmt: str, parts: Iterator[bytes], chunk_rows: int, skip_rows: int
) -> Iterator[Arrays]:
    """A generative model's rows: a request a line, as a job's body without the
    model (app.generation.requests.parse_row), each checked, its prompt measured."""
    from app.generation.requests import request_arrays
    from app.jobs.staging import checked_request

    if fmt != "jsonl":
        shape = '{"inputs": {"messages" or "prompt"}, "parameters": {...}}'
        raise BadRows(0, f"model {card.ref} generates: its batch file is .jsonl, a request a "
                         f"line ({shape})")  # fmt: skip
    block = []
    for row, line in _lines(parts):
        if row < skip_rows:
            continue
        try:
            request = checked_request(card, _json(row, line))
        except InvalidInputs as exc:
            raise BadRows(row, str(exc), exc.errors) from None
        block.append(request)
        if len(block) == chunk_rows:
            yield request_arrays(*block)
            block = []
    if block:
        yield request_arrays(*block)


def _csv_rows(
    card: ModelCard, parts: Iterator[bytes], chunk_rows: int, skip_rows: int
) -> Iterator[dict[str, Any]]:
    name = _single_input(card, "csv")
    spec = card.inputs[0]
    text = spec.datatype == "BYTES"
    vector = len(spec.shape) > 1

    def rows() -> Iterator[dict[str, Any]]:
        header = 0
        for line_no, line in _lines(parts):
            cells = next(csv.reader([line]))
            if line_no == 0 and not text and not _numeric(cells):
                header = 1
                continue
            row = line_no - header
            if row < skip_rows:
                continue
            if text:
                yield {name: cells[0] if len(cells) == 1 else ",".join(cells)}
                continue
            try:
                values = [float(cell) for cell in cells]
            except ValueError:
                raise BadRows(row, f"has a value that is not a number: {cells}") from None
            yield {name: values if vector else values[0]}

    return _gathered(rows(), [name], chunk_rows)


def _numeric(cells: list[str]) -> bool:
    try:
        [float(cell) for cell in cells]
    except ValueError:
        return False
    return True
