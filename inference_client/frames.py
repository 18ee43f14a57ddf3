"""pandas DataFrames and Parquet for batches, with pyarrow: a frame goes up as
the Parquet file the service reads (a column per model input), and results
come back as a frame in input order. pandas and pyarrow are the `parquet`
extra, imported only here and only when used (they carry no type hints, so
they are reached through importlib and typed Any)."""

from __future__ import annotations

import importlib
import io
import sys
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, TypeGuard

import numpy as np

from inference_client.resources import ResultRow
from inference_client.tensors import V2_DTYPES

PARQUET = "application/vnd.apache.parquet"
INSTALL = (
    'pip install "./inference_client[parquet]" (the parquet extra), or pip install pandas pyarrow'
)
# The service refuses row groups above 256 MiB (it reads one at a time): well under.
ROW_GROUP_BYTES = 64 * 1024 * 1024


def modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """pandas, pyarrow and pyarrow.parquet, or an ImportError that says how to get them."""
    try:
        return tuple(  # type: ignore[return-value]
            importlib.import_module(name) for name in ("pandas", "pyarrow", "pyarrow.parquet")
        )
    except ImportError as exc:
        raise ImportError(f"DataFrames and Parquet need pandas and pyarrow: {INSTALL}") from exc


def is_frame(value: object) -> TypeGuard[Any]:
    """A pandas DataFrame (pandas is not imported for this: no frame without it)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def to_parquet(frame: Any, columns: Mapping[str, Sequence[str]] | None = None) -> bytes:
    """The frame as a Parquet file, its index left out. `columns` gathers
    columns into one input: `{"pixels": ["p0", ..., "p63"]}` makes a column
    `pixels` holding each row's 64 values, in that order."""
    _, pa, pq = modules()
    packed: dict[str, Any] = {}
    for name, names in (columns or {}).items():
        wanted = list(names)
        missing = [str(c) for c in wanted if c not in frame.columns]
        if missing:
            raise KeyError(f"columns for input {name!r}: the frame has no {', '.join(missing)}")
        values = frame[wanted].to_numpy()
        packed[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), len(wanted))
    gathered = {c for names in (columns or {}).values() for c in names} | set(packed)
    rest = frame.drop(columns=[c for c in frame.columns if c in gathered])
    if len(rest.columns):
        table = pa.Table.from_pandas(rest, preserve_index=False)
        for name, array in packed.items():
            table = table.append_column(name, array)
    else:  # every column gathered (a table of no columns would have no rows)
        table = pa.table(packed)
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=max(1, ROW_GROUP_BYTES // row_bytes))
    return sink.getvalue()


def from_parquet(data: bytes) -> Any:
    """The frame of a Parquet file: a column per output, a vector output's
    values as one numpy array per row."""
    _, pa, pq = modules()
    return pq.read_table(pa.BufferReader(data)).to_pandas()


def from_rows(rows: Iterable[ResultRow], outputs: Sequence[Mapping[str, Any]]) -> Any:
    """The frame of JSON Lines result rows, shaped as `from_parquet` shapes it
    (dtypes from the model's `outputs` metadata), plus `error` and
    `error_message` columns when some row has no outputs. A failed row's
    outputs are missing (NaN, or None for vectors)."""
    pd, _, _ = modules()
    dtypes = {str(spec["name"]): V2_DTYPES.get(str(spec.get("datatype"))) for spec in outputs}
    index: list[int] = []
    values: dict[str, list[Any]] = {}
    errors: list[str | None] = []
    messages: list[str | None] = []
    for row in rows:
        index.append(row.row)
        got = row.outputs or {}
        for name in got:
            values.setdefault(name, [None] * (len(index) - 1))
        for name, column in values.items():
            column.append(got.get(name))
        errors.append(row.error.code if row.error is not None else None)
        messages.append(row.error.message if row.error is not None else None)
    named = [name for name in dtypes if name in values] + [n for n in values if n not in dtypes]
    if not values:  # no row has outputs: the model's columns, empty
        named, values = list(dtypes), {name: [None] * len(index) for name in dtypes}
    data = {name: _column(values[name], dtypes.get(name)) for name in named}
    if any(code is not None for code in errors):
        data["error"], data["error_message"] = errors, messages
    rows_index = pd.RangeIndex(len(index)) if index == list(range(len(index))) else index
    return pd.DataFrame(data, index=rows_index)


def _column(values: list[Any], dtype: str | None) -> Any:
    """A scalar output as a numpy column; a vector output as an object column
    of flat numpy arrays (what pyarrow makes of Parquet's list columns)."""
    if any(isinstance(v, list) for v in values):
        out = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            out[i] = None if value is None else np.asarray(value, dtype=dtype).reshape(-1)
        return out
    if all(v is not None for v in values):
        return np.asarray(values, dtype=dtype)
    kind = np.dtype(dtype).kind if dtype is not None else ""
    if kind and kind in "biuf":  # missing numbers are NaN, as pandas has them
        float_type = dtype if kind == "f" else "float64"
        return np.asarray([np.nan if v is None else v for v in values], dtype=float_type)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
