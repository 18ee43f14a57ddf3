"""A stream's answers (ModelStreamInfer): a job's outputs, or an error that names
its request, counted in GRPC_STREAM_REQUESTS by status."""

from __future__ import annotations

import uuid

import grpc

from app.errors import DomainError
from app.grpc import codec, status
from app.grpc.generated import grpc_service_pb2 as pb
from app.observability import metrics
from app.operations.calls import Answer, Call
from app.platform.broker import broker_unavailable
from app.platform.database import database_unavailable


def answered(
    request: codec.Reply, ended: Answer | DomainError, call: Call
) -> pb.ModelStreamInferResponse:
    """A call's answer once its job ended: its outputs, or its error."""
    if isinstance(ended, DomainError):
        return failure(request.id, request.model, status.of(ended), call.job_id)
    parameters = {"job_id": str(call.job_id)} if call.job_id else {}
    try:
        response = codec.encode(ended.card, request, ended.outputs, parameters)
    except DomainError as exc:
        return failure(request.id, request.model, status.of(exc), call.job_id)
    metrics.GRPC_STREAM_REQUESTS.labels("OK").inc()
    return pb.ModelStreamInferResponse(infer_response=response)


def refused(request: pb.ModelInferRequest, exc: Exception) -> pb.ModelStreamInferResponse:
    """A request that could not start."""
    if isinstance(exc, DomainError):
        mapped = status.of(exc)
    elif database_unavailable(exc):
        mapped = status.Status(grpc.StatusCode.UNAVAILABLE, "the database did not answer")
    elif broker_unavailable(exc):
        mapped = status.Status(grpc.StatusCode.UNAVAILABLE, "Redis (the broker) did not answer")
    else:
        mapped = status.unexpected(exc)
    return failure(request.id, request.model_name, mapped, None)


def failure(
    request_id: str, model: str, mapped: status.Status, job_id: uuid.UUID | None
) -> pb.ModelStreamInferResponse:
    """An error answer: `error_message` names the request (tritonclient hands over
    only that), and `infer_response` carries its id and the error's metadata as
    parameters for clients that read the message themselves."""
    metrics.GRPC_STREAM_REQUESTS.labels(mapped.code.name).inc()
    response = pb.ModelInferResponse(id=request_id, model_name=model)
    response.parameters["grpc_code"].string_param = mapped.code.name
    for key, value in mapped.metadata:
        response.parameters[key.replace("-", "_")].string_param = value
    if job_id is not None:
        response.parameters["job_id"].string_param = str(job_id)
    return pb.ModelStreamInferResponse(
        error_message=f"request {request_id!r}: {mapped.message()}", infer_response=response
    )
