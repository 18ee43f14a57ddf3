"""Checking a job's inputs against the model card, at submit time.

Two request forms are accepted and reduced to one: `{"<input>": <nested list>}`
and the KServe v2 tensor list `[{"name", "shape", "datatype", "data"}]`. Every
problem is reported per input with the expected name, shape and datatype, so a
bad job is refused with 422 instead of failing later in a worker.

BYTES inputs are lists of strings (text) or `{"b64": "..."}` objects (any
bytes: an image, a document, audio); in binary, raw bytes. They become object
arrays of `str` where an element is UTF-8 and `bytes` otherwise.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.cards import ModelCard, TensorSpec
from app.runtime.datatypes import (
    NUMPY_TO_V2,
    V2_TO_NUMPY,
    decode_bytes,
    element,
    encode_bytes,
    is_bytes,
    is_float,
    json_values,
)

_ACCEPTED_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}


class InvalidInputs(ValueError):
    """`errors` maps an input name (or `inputs`) to what was wrong with it."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


def describe(spec: TensorSpec) -> str:
    dims = ", ".join("any" if d < 0 else str(d) for d in spec.shape)
    return f"{spec.datatype} tensor of shape [{dims}]"


def parse_inputs(card: ModelCard, raw: Any) -> dict[str, np.ndarray]:
    """Arrays of the card's datatypes, keyed by input name; raises InvalidInputs."""
    if isinstance(raw, dict):
        named = raw
        shapes: dict[str, Any] = {}
    elif isinstance(raw, list):
        named, shapes = _from_v2_tensors(card, raw)
    else:
        raise InvalidInputs(
            {
                "inputs": "expected an object mapping input names to nested lists, "
                "or a list of KServe v2 tensors {name, shape, datatype, data}"
            }
        )
    errors: dict[str, str] = {}
    arrays: dict[str, np.ndarray] = {}
    for name in named:
        if card.input(name) is None:
            expected = ", ".join(f"'{s.name}' ({describe(s)})" for s in card.inputs)
            errors[name] = f"model {card.ref} has no input '{name}'; its inputs are {expected}"
    for spec in card.inputs:
        if spec.name not in named:
            errors.setdefault(spec.name, f"missing; expected a {describe(spec)}")
            continue
        try:
            arrays[spec.name] = _to_array(
                spec, named[spec.name], shapes.get(spec.name), spec.name in card.text_inputs
            )
        except ValueError as exc:
            errors[spec.name] = str(exc)
    if errors:
        raise InvalidInputs(errors)
    return arrays


def to_json(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Nested lists, as returned to clients (bytes that are not text as `{"b64"}`)."""
    return {name: json_values(array) for name, array in arrays.items()}


def pack(arrays: dict[str, np.ndarray]) -> bytes:
    """Tensors as stored with a job: a length-prefixed JSON header naming each
    tensor's datatype and shape, then their raw little-endian bytes in order
    (a BYTES tensor's elements each as a 4-byte length and their UTF-8 bytes).
    About the raw size (float32 stays 4 bytes a value); `unpack` reads it
    without parsing a number."""
    header = pack_header(
        [(name, NUMPY_TO_V2[array.dtype], array.shape) for name, array in arrays.items()]
    )
    parts = [header]
    parts += [
        encode_bytes(a)
        if a.dtype == object
        else np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
        for a in arrays.values()
    ]
    return b"".join(parts)


def pack_header(tensors: list[tuple[str, str, tuple[int, ...]]]) -> bytes:
    """The packed form's header alone, for (name, datatype, shape) of each tensor:
    followed by the tensors' bytes it is `pack`'s output."""
    header = [{"name": n, "datatype": d, "shape": list(s)} for n, d, s in tensors]
    head = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<I", len(head)) + head


def tensor_bytes(header: bytes) -> int:
    """How many bytes of data follow a packed header of fixed-size datatypes."""
    (length,) = struct.unpack_from("<I", header)
    tensors = json.loads(header[4 : 4 + length])
    return sum(math.prod(t["shape"]) * V2_TO_NUMPY[t["datatype"]].itemsize for t in tensors)


def unpack(data: bytes | memoryview) -> dict[str, np.ndarray]:
    (length,) = struct.unpack_from("<I", data)
    return _arrays(json.loads(bytes(data[4 : 4 + length])), data, 4 + length)


def unpack_apart(header: bytes, data: bytes | memoryview) -> dict[str, np.ndarray]:
    """`unpack(header + data)` without joining them: `data` (a batch chunk's rows,
    megabytes) is read where it lies, not copied after its header."""
    (length,) = struct.unpack_from("<I", header)
    return _arrays(json.loads(header[4 : 4 + length]), data, 0)


def _arrays(
    tensors: list[dict[str, Any]], data: bytes | memoryview, offset: int
) -> dict[str, np.ndarray]:
    """The tensors a packed header names, from `data` at `offset` on, which they
    must fill to its end."""
    arrays: dict[str, np.ndarray] = {}
    for tensor in tensors:
        count = math.prod(tensor["shape"])
        if is_bytes(tensor["datatype"]):
            items, offset = decode_bytes(data, count, offset)
            for i, item in enumerate(items):
                items[i] = element(item)
            arrays[tensor["name"]] = items.reshape(tensor["shape"])
            continue
        dtype = V2_TO_NUMPY[tensor["datatype"]].newbyteorder("<")
        array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
        arrays[tensor["name"]] = array.reshape(tensor["shape"])
        offset += count * dtype.itemsize
    if offset != len(data):
        raise ValueError(f"packed tensors: {len(data) - offset} bytes left over")
    return arrays


def from_json(specs: Sequence[TensorSpec], stored: dict[str, Any]) -> dict[str, np.ndarray]:
    """Arrays of the specs' datatypes from nested lists stored with a job (inputs
    checked at submit time, or outputs): exact, as float32 survives the round trip."""
    return {
        spec.name: _texts(stored[spec.name])
        if is_bytes(spec.datatype)
        else np.asarray(stored[spec.name], dtype=V2_TO_NUMPY[spec.datatype])
        for spec in specs
    }


def _texts(value: Any) -> np.ndarray:
    """An object array of the strings (or `{"b64"}` objects) in (nested) `value`."""
    array = _object_array(value)
    for index, item in np.ndenumerate(array):
        if isinstance(item, dict):
            array[index] = element(base64.b64decode(item["b64"]))
    return array


def _object_array(value: Any) -> np.ndarray:
    """An object array of nested lists whose leaves are strings or `{"b64"}`
    objects, never split further (numpy would take a dict for a scalar, a string
    for a sequence of one; ragged lists raise ValueError)."""
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    array = np.empty(shape, dtype=object)
    flat: list[Any] = []

    def walk(item: Any, depth: int) -> None:
        if depth == len(shape):
            if isinstance(item, list):
                raise ValueError("ragged")
            flat.append(item)
            return
        if not isinstance(item, list) or len(item) != shape[depth]:
            raise ValueError("ragged")
        for child in item:
            walk(child, depth + 1)

    walk(value, 0)
    array.reshape(-1)[:] = flat if flat else []
    return array


def _from_v2_tensors(card: ModelCard, tensors: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    named: dict[str, Any] = {}
    shapes: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for index, tensor in enumerate(tensors):
        where = f"inputs[{index}]"
        if not isinstance(tensor, dict) or not {"name", "shape", "datatype", "data"} <= set(tensor):
            errors[where] = "expected a tensor object with name, shape, datatype and data"
            continue
        name = str(tensor["name"])
        spec = card.input(name)
        if spec is not None and tensor["datatype"] != spec.datatype:
            errors[name] = (
                f"datatype {tensor['datatype']!r} does not match the model; "
                f"expected {spec.datatype}"
            )
            continue
        named[name] = tensor["data"]
        shapes[name] = tensor["shape"]
    if errors:
        raise InvalidInputs(errors)
    return named, shapes


def _to_array(spec: TensorSpec, value: Any, declared_shape: Any, text: bool = False) -> np.ndarray:
    expected = describe(spec)
    try:
        array = _text_array(value, expected, text) if is_bytes(spec.datatype) else np.asarray(value)
    except _NotText as exc:
        raise ValueError(str(exc)) from None
    except ValueError:
        raise ValueError(f"is a ragged nested list; expected a {expected}") from None
    dtype = V2_TO_NUMPY[spec.datatype]
    if array.dtype.kind not in _ACCEPTED_KINDS.get(dtype.kind, dtype.kind):
        kind = "numbers" if is_float(spec.datatype) else f"{spec.datatype} values"
        raise ValueError(f"must contain only {kind}; expected a {expected}")
    if declared_shape is not None:
        array = _reshape(array, declared_shape, expected)
    if array.ndim != len(spec.shape) or any(
        want >= 0 and got != want for got, want in zip(array.shape, spec.shape, strict=False)
    ):
        raise ValueError(f"has shape {list(array.shape)}; expected a {expected}")
    if array.size == 0:
        raise ValueError(f"is empty; expected a {expected} with at least one element")
    if dtype.kind in "iu" and array.dtype.kind in "iu":
        limits = np.iinfo(dtype)
        if array.min() < limits.min or array.max() > limits.max:
            raise ValueError(
                f"has values outside {spec.datatype}'s range ({limits.min} to {limits.max}); "
                f"expected a {expected}"
            )
    with np.errstate(over="ignore"):  # a value too large becomes inf, refused just below
        converted = array if array.dtype == object else array.astype(dtype, copy=False)
    if dtype.kind == "f" and not np.isfinite(converted).all():
        raise ValueError(f"contains NaN, infinity or a value too large for {spec.datatype}")
    return converted


class _NotText(ValueError):
    pass


def _text_array(value: Any, expected: str, text: bool = False) -> np.ndarray:
    """Strings, `{"b64": "..."}` objects and bytes as an object array of `str`
    (UTF-8 text) and `bytes` (anything else; refused where the model reads `text`);
    anything else, numbers included, is refused rather than turned into text."""
    if isinstance(value, np.ndarray):  # binary tensor data (bytes), or read from a file
        if value.dtype.kind not in "OUS":
            raise _NotText(f"must contain only strings, not {value.dtype}; expected a {expected}")
        array = value.astype(object)
    elif isinstance(value, list):
        array = _object_array(value)
    else:
        raise _NotText(f"must be a list of strings; expected a {expected}")
    for index, item in np.ndenumerate(array):
        where = list(index) if len(index) > 1 else index[0]
        if isinstance(item, dict):
            item = array[index] = element(_b64(item, where, expected))
        elif isinstance(item, bytes):
            item = array[index] = element(item)
        if isinstance(item, bytes) and text:
            raise _NotText(f"element {where} is not UTF-8; expected a {expected} of text")
        if not isinstance(item, str | bytes):
            raise _NotText(
                f"must contain only strings; element {where} is {_kind(item)}, "
                f"expected a {expected}"
            )
    return array


def _b64(item: dict[str, Any], where: Any, expected: str) -> bytes:
    """The bytes of a `{"b64": "..."}` element (standard base64, padded)."""
    data = item.get("b64")
    if set(item) != {"b64"} or not isinstance(data, str):
        raise _NotText(f'element {where} is an object; bytes are sent as {{"b64": "<base64>"}}, '
                       f"text as a string; expected a {expected}")  # fmt: skip
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _NotText(f"element {where}: b64 is not base64; expected a {expected}") from None


def _kind(item: Any) -> str:
    if isinstance(item, list | dict):
        return "a list" if isinstance(item, list) else "an object"
    if item is None:
        return "null"
    if isinstance(item, bool):
        return "a boolean"
    return "a number" if isinstance(item, int | float) else type(item).__name__


def _reshape(array: np.ndarray, shape: Any, expected: str) -> np.ndarray:
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"shape must be a list of non-negative integers; expected a {expected}")
    if array.size != math.prod(shape):
        raise ValueError(
            f"data has {array.size} elements but shape {shape} needs {math.prod(shape)}"
        )
    return array.reshape(shape)
