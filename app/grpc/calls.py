"""What a unary call and a stream's requests share: the operations' request made
from a decoded call and the RPC's deadline, the outputs checked before anything
runs, and how the operations hear that the caller left."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import grpc

from app.errors import InvalidRequest
from app.grpc import codec
from app.observability import tracing
from app.operations import InferRequest
from app.operations.models import ModelCard

# grpcio's time_remaining() for a call without a deadline: a huge number, not None.
NO_DEADLINE_S = 10 * 365 * 86400.0


def infer_request(call: codec.Call, context: grpc.ServicerContext) -> InferRequest:
    """The call operations' request for a decoded call. A gRPC deadline becomes the
    job's deadline (nobody waits for it after), and the wait ends a little before
    it, so the caller still hears DEADLINE_EXCEEDED with the job's id from us."""
    remaining = context.time_remaining()
    timeout_s, deadline = call.timeout_s, None
    if remaining is not None and remaining < NO_DEADLINE_S:
        deadline = datetime.now(UTC) + timedelta(seconds=remaining)
        answer_by = max(0.001, remaining - min(0.25, remaining * 0.1))
        timeout_s = min(timeout_s or answer_by, answer_by)
    traceparent = dict(context.invocation_metadata() or ()).get(tracing.TRACEPARENT)
    return InferRequest(
        call.model, call.tensors, version=call.version, timeout_s=timeout_s, deadline=deadline,
        parameters=call.parameters, traceparent=tracing.valid(str(traceparent or "")),
    )  # fmt: skip


def check_outputs(card: ModelCard, call: codec.Call) -> None:
    """Outputs the model lacks are refused before anything runs."""
    unknown = codec.unsupported_outputs(card, call)
    if unknown:
        names = [spec.name for spec in card.outputs]
        raise InvalidRequest(
            f"outputs: model {card.ref} has no output {unknown}; it has {names}",
            errors={"outputs": [f"one of {names}"]},
        )


def leaving(context: grpc.ServicerContext) -> Callable[[Callable[[], None]], object]:
    """How the call operations hear that a caller left: the call's end (a cancel, a
    lost connection; also a normal end, which comes after the answer). A call
    already over runs `callback` at once."""

    def register(callback: Callable[[], None]) -> object:
        if not context.add_callback(callback):
            callback()
        return None

    return register
