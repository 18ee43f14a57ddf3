"""KServe v2 protobuf tensors in and out (Triton's `ModelInferRequest` / `Response`).

An input comes as typed `contents` (the repeated field of its datatype) or as
`raw_input_contents` (little-endian bytes, one entry per input in order; a
BYTES element is a 4-byte length and its bytes), as `tritonclient.grpc` sends
it. Decoding checks only the protocol's own shape and yields the same v2
tensor list the HTTP door makes (`{"name", "datatype", "shape", "data"}`,
data an ndarray), which the operations check against the model's card like
any job's inputs. Outputs always go back as `raw_output_contents`, as Triton's
server sends them. Triton's `triton_enable_empty_final_response` (tritonclient's
`enable_empty_final_response`) is read as the protocol's, not passed to the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import InvalidRequest
from app.grpc.generated import grpc_service_pb2 as pb
from app.operations.models import ModelCard
from app.runtime.datatypes import V2_TO_NUMPY, encode_bytes, from_raw, is_bytes

# The typed `contents` field of each datatype (FP16 has none: raw only).
CONTENTS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_SEQUENCES = (
    "sequence batching (sequence_id, sequence_start, sequence_end) is not supported; "
    "send each request on its own"
)
# Triton parameters that change what a request means, which this service does not do.
_REFUSED_PARAMETERS = {
    "sequence_id": _SEQUENCES,
    "sequence_start": _SEQUENCES,
    "sequence_end": _SEQUENCES,
    "classification": "the classification extension is not supported; ask for the model's "
    "outputs as they are",
}
# A streaming client's ask for an empty response flagged final after a decoupled
# model's last one (app.grpc.generations).
EMPTY_FINAL = "triton_enable_empty_final_response"
# Parameters of the protocol itself, never the model's.
_PROTOCOL = ("timeout", "binary_data_output", EMPTY_FINAL)


@dataclass(frozen=True)
class Reply:
    """What answering a request needs of it: its id, model and the outputs it
    wants (None: all), and whether it asked for an empty final response. Not its
    tensors: a stream keeps this while its job runs."""

    id: str
    model: str
    outputs: list[str] | None
    empty_final: bool = False


@dataclass(frozen=True)
class Call:
    """What a request asks, decoded: the v2 tensors, the outputs wanted (None: all)
    and Triton's `timeout` parameter (microseconds), in seconds."""

    model: str
    version: str | None
    id: str
    tensors: list[dict[str, Any]]
    outputs: list[str] | None
    timeout_s: float | None
    # The request's other parameters: a generative model's sampling parameters.
    parameters: dict[str, Any] | None = None
    empty_final: bool = False  # EMPTY_FINAL: the stream's last response, flagged, if empty

    def reply(self) -> Reply:
        return Reply(self.id, self.model, self.outputs, self.empty_final)


def decode(request: pb.ModelInferRequest) -> Call:
    """InvalidRequest names what does not follow the protocol."""
    if not request.model_name:
        raise _invalid("model_name", "name the model to run")
    _check_parameters(request.parameters, "parameters")
    raw = request.raw_input_contents
    typed = [t.name for t in request.inputs if t.HasField("contents")]
    if raw and typed:  # Triton's rule, and its words (its clients' tests look for them)
        raise _invalid(
            "raw_input_contents",
            f"contents field must not be specified when using raw_input_contents for "
            f"'{typed[0]}' for model '{request.model_name}': send every input's data in "
            "raw_input_contents, or every input's in typed contents",
        )
    if raw and len(raw) != len(request.inputs):
        raise _invalid(
            "raw_input_contents",
            f"has {len(raw)} entries for {len(request.inputs)} inputs; send one per input, "
            "in the order of `inputs`, or typed `contents` for every input",
        )
    tensors = [
        _tensor(tensor, raw[index] if raw else None, index)
        for index, tensor in enumerate(request.inputs)
    ]
    outputs = None
    if request.outputs:
        for index, output in enumerate(request.outputs):
            _check_parameters(output.parameters, f"outputs[{index}].parameters")
        outputs = [output.name for output in request.outputs]
    return Call(
        model=request.model_name,
        version=request.model_version or None,
        id=request.id,
        tensors=tensors,
        outputs=outputs,
        timeout_s=_timeout(request.parameters),
        parameters=_sampling(request.parameters),
        empty_final=_flag(request.parameters, EMPTY_FINAL),
    )


def encode(
    card: ModelCard,
    call: Reply,
    arrays: dict[str, np.ndarray],
    parameters: dict[str, str],
) -> pb.ModelInferResponse:
    """The response: the outputs the call asked for (every output by default), as
    raw little-endian bytes in the card's datatypes, and string `parameters`
    (the job's id)."""
    names = [spec.name for spec in card.outputs]
    wanted = names if call.outputs is None else call.outputs
    unknown = [name for name in wanted if name not in arrays]
    if unknown:
        raise _invalid("outputs", f"model {card.ref} has no output {unknown}; it has {names}")
    datatypes = {spec.name: spec.datatype for spec in card.outputs}
    response = pb.ModelInferResponse(model_name=card.name, model_version=card.version, id=call.id)
    for key, value in parameters.items():
        response.parameters[key].string_param = value
    for name in wanted:
        datatype = datatypes[name]
        array = np.ascontiguousarray(arrays[name], dtype=V2_TO_NUMPY[datatype])
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(
            encode_bytes(array)
            if is_bytes(datatype)
            else array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        )
    return response


def unsupported_outputs(card: ModelCard, call: Call) -> list[str]:
    """Requested outputs the model does not have (checked before anything runs)."""
    names = {spec.name for spec in card.outputs}
    return [name for name in call.outputs or () if name not in names]


def _tensor(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, index: int
) -> dict[str, Any]:
    where = f"inputs[{index}]" + (f" ({tensor.name})" if tensor.name else "")
    if not tensor.name:
        raise _invalid(where, "name the input")
    _check_parameters(tensor.parameters, f"{where}.parameters")
    datatype, shape = tensor.datatype, list(tensor.shape)
    if datatype not in V2_TO_NUMPY:
        raise _invalid(where, f"datatype must be one of {', '.join(V2_TO_NUMPY)}; got {datatype!r}")
    if any(d < 0 for d in shape):
        raise _invalid(where, f"shape must be non-negative integers; got {shape}")
    if raw is not None:
        if tensor.HasField("contents"):
            raise _invalid(where, "send its data in raw_input_contents or contents, not both")
        try:
            data = from_raw(datatype, shape, raw)
        except ValueError as exc:
            raise _invalid(where, f"raw_input_contents: {exc}") from None
    else:
        data = _typed(tensor, datatype, shape, where)
    return {"name": tensor.name, "datatype": datatype, "shape": shape, "data": data}


def _typed(
    tensor: pb.ModelInferRequest.InferInputTensor, datatype: str, shape: list[int], where: str
) -> np.ndarray:
    field = CONTENTS.get(datatype)
    if field is None:
        raise _invalid(where, f"{datatype} data can only be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise _invalid(
            where,
            f"contents.{field} has {len(values)} values but shape {shape} needs {count}",
        )
    dtype = object if is_bytes(datatype) else V2_TO_NUMPY[datatype]
    return np.array(values, dtype=dtype).reshape(shape)


def _check_parameters(parameters: Any, where: str) -> None:
    for key in parameters:
        if key in _REFUSED_PARAMETERS:
            raise _invalid(f"{where}.{key}", _REFUSED_PARAMETERS[key])


def _sampling(parameters: Any) -> dict[str, Any] | None:
    """The parameters beside the protocol's own, as plain values (Triton's vLLM
    backend takes max_tokens, temperature, ... so)."""
    found = {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in parameters.items()
        if key not in _PROTOCOL and value.WhichOneof("parameter_choice")
    }
    return found or None


def _flag(parameters: Any, key: str) -> bool:
    """A bool parameter: false when absent; InvalidRequest when not a bool."""
    if key not in parameters:
        return False
    parameter = parameters[key]
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise _invalid(f"parameters.{key}", "must be a bool_param")
    return bool(parameter.bool_param)


def _timeout(parameters: Any) -> float | None:
    if "timeout" not in parameters:
        return None
    parameter = parameters["timeout"]
    kind = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, kind) if kind in ("int64_param", "uint64_param") else 0
    if value <= 0:
        raise _invalid("parameters.timeout", "must be a positive integer of microseconds")
    return float(value) / 1e6


def _invalid(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {message}", errors={where: [message]})
