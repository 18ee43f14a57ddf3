"""Tensors to and from JSON, with numpy when it is installed and plain nested
lists when it is not (numpy is optional for this package)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import numpy as np
except ImportError:  # pragma: no cover - exercised only without numpy
    np = None  # type: ignore[assignment]

# KServe v2 datatype -> numpy dtype name
V2_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
_NUMPY_TO_V2 = {dtype: name for name, dtype in V2_DTYPES.items()}


def is_array(value: Any) -> bool:
    return np is not None and isinstance(value, np.ndarray)


def jsonable(value: Any) -> Any:
    """Nested lists of plain numbers and strings from arrays, numpy scalars,
    tuples and bytes (as UTF-8 text, which is how BYTES travel as JSON)."""
    if np is not None and isinstance(value, np.ndarray | np.generic):
        return jsonable(value.tolist())
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def shape_of(value: Any) -> list[int]:
    """The shape of a rectangular nested list (strings are elements)."""
    if is_array(value):
        return [int(d) for d in value.shape]
    shape: list[int] = []
    while isinstance(value, Sequence) and not isinstance(value, str | bytes):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def flatten(value: Any) -> list[Any]:
    """The elements of a nested list (or array) in row-major order, as JSON values."""
    if is_array(value):
        flat: list[Any] = jsonable(value.reshape(-1))
        return flat
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [item for part in value for item in flatten(part)]
    return [jsonable(value)]


def is_v2_tensors(inputs: Any) -> bool:
    """A list of KServe v2 tensors (`{"name", "datatype", ...}` each), sent as they are."""
    return (
        isinstance(inputs, Sequence)
        and not isinstance(inputs, str | bytes)
        and bool(inputs)
        and all(isinstance(t, Mapping) and "datatype" in t and "name" in t for t in inputs)
    )


def v2_tensor(tensor: Mapping[str, Any]) -> dict[str, Any]:
    """A v2 tensor as JSON: array data flattened, its shape taken from it if absent."""
    out = {str(k): v for k, v in tensor.items()}
    data = out.get("data")
    if "shape" not in out:
        out["shape"] = shape_of(data)
    out["data"] = flatten(data)
    return out


def datatype_of(value: Any) -> str | None:
    """The v2 datatype of a numpy array, or None (the model's metadata decides)."""
    if not is_array(value):
        return None
    if value.dtype.kind in "USO":
        return "BYTES"
    return _NUMPY_TO_V2.get(value.dtype.name)


def from_v2(datatype: str, shape: Sequence[int], data: Sequence[Any]) -> Any:
    """A v2 output tensor: a numpy array of its datatype, or nested lists without numpy."""
    if np is not None:
        dtype = V2_DTYPES.get(datatype)
        if dtype == "object":
            array = np.empty(len(data), dtype=object)
            array[:] = list(data)
            return array.reshape(tuple(shape))
        return np.asarray(data, dtype=dtype).reshape(tuple(shape))
    return nest(list(data), list(shape))


def nest(flat: list[Any], shape: list[int]) -> Any:
    """Row-major nested lists of `shape` from a flat list."""
    if not shape:
        return flat[0] if flat else None
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    return [nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def to_npy(value: Any) -> bytes:
    """An array as the bytes of a .npy file (never pickled)."""
    if np is None:
        raise RuntimeError("numpy is needed to write .npy")
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(value), allow_pickle=False)
    return buffer.getvalue()


def from_npy(data: bytes) -> Any:
    """The array in the bytes of a .npy file (pickled objects refused)."""
    if np is None:
        raise RuntimeError("numpy is needed to read .npy; read batch results as JSON Lines")
    return np.load(io.BytesIO(data), allow_pickle=False)
