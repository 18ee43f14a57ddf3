"""The KServe v2 / Open Inference Protocol's infer request and response, over HTTP.

Two body forms: JSON alone, and the binary tensor data extension that
`tritonclient.http` uses by default: a JSON header of
`Inference-Header-Content-Length` bytes, then the raw bytes of each input that
names a `binary_data_size`, in the order the inputs are listed. Responses use
the same form: an output is sent as binary when the request asked for it (per
output `parameters.binary_data`, or `binary_data_output` for all), JSON
otherwise. A BYTES tensor is strings in JSON; in binary, each element is a
4-byte little-endian length followed by its bytes, as Triton sends it.

Decoding checks only the protocol's own shape; `tensors.parse_inputs` then
checks the tensors against the model's card, like any job's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.errors import InvalidRequest
from app.operations.models import ModelCard
from app.runtime.datatypes import V2_TO_NUMPY, encode_bytes, from_raw, is_bytes, json_values
from app.web import json_codec

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY = "application/octet-stream"


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    tensors: list[dict[str, Any]]  # v2 input tensors; binary ones carry an ndarray as data
    outputs: dict[str, bool] | None  # requested output -> as binary; None: every output
    binary_outputs: bool  # the default for outputs not named
    timeout_s: float | None  # Triton's `timeout` parameter (microseconds), in seconds
    parameters: dict[str, Any] = field(default_factory=dict)


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """Raises InvalidRequest naming what does not follow the protocol."""
    head, rest = _split(body, header_length)
    try:
        raw = json_codec.loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _invalid("body", f"is not a JSON inference request ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("inputs"), list):
        raise _invalid("inputs", "expected an object with a list of input tensors under 'inputs'")
    parameters = _object(raw.get("parameters"), "parameters")
    tensors, offset = [], 0
    for index, tensor in enumerate(raw["inputs"]):
        tensor_parameters = _object(
            tensor.get("parameters") if isinstance(tensor, dict) else None, f"inputs[{index}]"
        )
        size = tensor_parameters.get("binary_data_size")
        if size is None:
            tensors.append(tensor)
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _invalid(f"inputs[{index}]", "binary_data_size must be a non-negative integer")
        if offset + size > len(rest):
            raise _invalid(
                f"inputs[{index}]",
                f"binary_data_size {size} runs past the body's {len(rest)} bytes of tensor data",
            )
        tensors.append({**tensor, "data": _from_bytes(tensor, rest[offset : offset + size], index)})
        offset += size
    if offset != len(rest):
        raise _invalid("body", f"{len(rest) - offset} bytes of tensor data belong to no input")
    return InferRequest(
        id=str(raw["id"]) if raw.get("id") is not None else None,
        tensors=tensors,
        outputs=_requested_outputs(raw.get("outputs")),
        binary_outputs=parameters.get("binary_data_output") is True,
        timeout_s=_timeout(parameters.get("timeout")),
        parameters=parameters,
    )


# Request parameters of the protocol itself; the others are a generative model's
# sampling parameters (max_tokens, temperature, ...), as Triton's vLLM backend names them.
PROTOCOL_PARAMETERS = ("binary_data_output", "timeout")


def sampling_parameters(parameters: dict[str, Any]) -> dict[str, Any] | None:
    found = {k: v for k, v in parameters.items() if k not in PROTOCOL_PARAMETERS}
    return found or None


def encode_response(
    card: ModelCard,
    request: InferRequest,
    arrays: dict[str, np.ndarray],
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers (Content-Type, and the header length
    when binary tensors follow the JSON)."""
    names = [spec.name for spec in card.outputs]
    wanted = names if request.outputs is None else list(request.outputs)
    unknown = [name for name in wanted if name not in arrays]
    if unknown:
        raise _invalid("outputs", f"model {card.ref} has no output {unknown}; it has {names}")
    datatypes = {spec.name: spec.datatype for spec in card.outputs}
    tensors, blobs = [], []
    for name in wanted:
        array = np.ascontiguousarray(arrays[name], dtype=V2_TO_NUMPY[datatypes[name]])
        tensor: dict[str, Any] = {
            "name": name,
            "datatype": datatypes[name],
            "shape": list(array.shape),
        }
        binary = request.binary_outputs if request.outputs is None else request.outputs[name]
        if binary:
            blob = (
                encode_bytes(array)
                if is_bytes(datatypes[name])
                else array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            )
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = json_values(array.reshape(-1))
        tensors.append(tensor)
    response: dict[str, Any] = {
        "model_name": card.name,
        "model_version": card.version,
        "outputs": tensors,
    }
    if request.id is not None:
        response["id"] = request.id
    if parameters:
        response["parameters"] = parameters
    head = json_codec.dumps_bytes(response, sort_keys=False)
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return b"".join([head, *blobs]), {"Content-Type": BINARY, HEADER_LENGTH: str(len(head))}


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise _invalid(
            HEADER_LENGTH,
            f"must be the length of the JSON header, 0 to {len(body)} bytes; got {header_length!r}",
        )
    return body[:length], body[length:]


def _from_bytes(tensor: dict[str, Any], data: bytes, index: int) -> np.ndarray:
    shape = tensor.get("shape")
    try:
        if not isinstance(shape, list):
            raise ValueError("shape must be a list of non-negative integers")
        return from_raw(str(tensor.get("datatype")), shape, data)
    except ValueError as exc:
        raise _invalid(f"inputs[{index}]", str(exc)) from None


def _requested_outputs(raw: Any) -> dict[str, bool] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _invalid("outputs", "expected a list of {name, parameters} objects")
    outputs: dict[str, bool] = {}
    for index, output in enumerate(raw):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise _invalid(f"outputs[{index}]", "expected an object with a 'name'")
        parameters = _object(output.get("parameters"), f"outputs[{index}]")
        outputs[output["name"]] = parameters.get("binary_data") is True
    return outputs


def _timeout(raw: Any) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0:
        raise _invalid("parameters.timeout", "must be a positive integer of microseconds")
    return raw / 1e6


def _object(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _invalid(where, "parameters must be an object")
    return raw


def _invalid(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {message}", errors={where: [message]})
