"""KServe v2 datatypes and their numpy / ONNX equivalents.

BYTES tensors are numpy object arrays whose elements are `str` where they are
UTF-8 text and `bytes` otherwise (an image, audio): clients send text as JSON
strings, anything as `{"b64": "..."}` in JSON (TensorFlow Serving's convention)
or raw in binary, each element a 4-byte little-endian length and its bytes, as
Triton does. `tokenize` pipeline steps read text; a model's own code gets
`bytes` (app.runtime.code).
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import numpy as np

# v2 datatype -> numpy dtype
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

NUMPY_TO_V2: dict[np.dtype, str] = {dtype: name for name, dtype in V2_TO_NUMPY.items()}

# ONNX Runtime's type strings -> v2 datatype
ORT_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

BYTES = "BYTES"


def is_float(datatype: str) -> bool:
    return datatype.startswith("FP")


def is_bytes(datatype: str) -> bool:
    return datatype == BYTES


def element(data: bytes) -> str | bytes:
    """A BYTES element as held in memory: its text where it is UTF-8, else its bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def json_element(item: str | bytes) -> str | dict[str, str]:
    """A BYTES element in JSON: its text, or `{"b64": ...}` for bytes that are
    not UTF-8 (TensorFlow Serving's convention, which requests may use too)."""
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(item).decode("ascii")}
    return item


def json_values(array: np.ndarray) -> list[Any]:
    """`array.tolist()`, with a BYTES array's bytes that are not text as `{"b64"}`."""
    if array.dtype != object:
        return array.tolist()
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        out[index] = json_element(item) if isinstance(item, bytes | str) else item
    return out.tolist()


def encode_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor's elements, each as a 4-byte little-endian length then its
    bytes (text as UTF-8): Triton's binary form, also how jobs store them."""
    parts = []
    for item in array.reshape(-1):
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def decode_bytes(data: bytes | memoryview, count: int, offset: int = 0) -> tuple[np.ndarray, int]:
    """`count` length-prefixed elements from `offset`: an object array of `bytes`
    and the offset after them. ValueError where the data runs short. The array is
    made once they are read: a shape far larger than its data (a hostile count)
    fails at the first missing element, never allocating for it."""
    found: list[bytes] = []
    view = memoryview(data)
    for i in range(count):
        if offset + 4 > len(view):
            raise ValueError(f"BYTES element {i} has no 4-byte length: the data ends")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise ValueError(f"BYTES element {i} says {length} bytes; the data ends before")
        found.append(bytes(view[offset : offset + length]))
        offset += length
    items = np.empty(count, dtype=object)
    items[:] = found
    return items, offset


def from_raw(datatype: str, shape: list[int], data: bytes | memoryview) -> np.ndarray:
    """A tensor sent as raw bytes (KServe v2's binary extension over HTTP,
    `raw_input_contents` over gRPC): little-endian values, or length-prefixed
    BYTES elements. ValueError says what does not fit: the datatype, the shape,
    or a size that is not the shape's."""
    if datatype not in V2_TO_NUMPY:
        raise ValueError(f"binary data needs a datatype of {', '.join(V2_TO_NUMPY)}; "
                         f"got {datatype!r}")  # fmt: skip
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError("shape must be a list of non-negative integers")
    count = math.prod(shape)
    if is_bytes(datatype):
        try:
            items, end = decode_bytes(data, count)
        except ValueError as exc:
            raise ValueError(f"binary data does not fit shape {shape}: {exc}") from None
        if end != len(data):
            raise ValueError(
                f"data of {len(data)} bytes does not fit shape {shape} of BYTES "
                f"({len(data) - end} bytes after the last element)"
            )
        return items.reshape(shape)
    dtype = V2_TO_NUMPY[datatype].newbyteorder("<")
    if len(data) != count * dtype.itemsize:
        raise ValueError(
            f"data of {len(data)} bytes does not fit shape {shape} of {datatype} "
            f"({count * dtype.itemsize} bytes)"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)
