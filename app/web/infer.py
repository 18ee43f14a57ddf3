"""KServe v2 sync inference: POST /v2/models/<name>[/versions/<v>]/infer.

JSON or the binary tensor extension in, the same form out; `tritonclient.http`
works against it unchanged. Handlers only translate HTTP; the call operations run
the request.
"""

from __future__ import annotations

from typing import Any

from flask import Response, request

from app.observability import tracing
from app.operations import InferRequest
from app.web import kserve
from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint
from app.web.context import services

blp = Blueprint("inference", __name__, description="Synchronous inference (KServe v2)")

# JSON alone, or a JSON header followed by binary tensor data: both ways.
_EITHER_FORM = {
    "application/json": {"schema": {"type": "object"}},
    kserve.BINARY: {"schema": {"type": "string", "format": "binary"}},
}
_BODY = {
    "description": "A KServe v2 inference request: JSON, or a JSON header of "
    "`Inference-Header-Content-Length` bytes followed by binary tensor data",
    "content": _EITHER_FORM,
}
_ANSWER = {
    "description": "The outputs, as JSON or with binary tensor data after the JSON "
    "header; `parameters.job_id` names the job that ran it (absent for inline models)",
    "content": _EITHER_FORM,
}


@blp.post("/v2/models/<name>/infer")
@blp.post("/v2/models/<name>/versions/<version>/infer")
@blp.doc(requestBody=_BODY, responses={"200": _ANSWER})
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model or version")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Inputs do not fit")
@blp.alt_response(504, response="GATEWAY_TIMEOUT", description="Not done in time; names the job")
@authenticated
def infer(name: str, version: str | None = None) -> Response:
    call = kserve.decode_request(
        request.get_data(), request.headers.get(kserve.HEADER_LENGTH)
    )  # after authentication: an anonymous body is never parsed
    answer = services().calls.infer(
        current_tenant(),
        InferRequest(
            name,
            call.tensors,
            version=version,
            timeout_s=call.timeout_s,
            parameters=kserve.sampling_parameters(call.parameters),
            traceparent=tracing.valid(request.headers.get(tracing.TRACEPARENT)),
        ),
    )
    parameters: dict[str, Any] = {"job_id": str(answer.job_id)} if answer.job_id else {}
    body, headers = kserve.encode_response(answer.card, call, answer.outputs, parameters)
    return Response(body, status=200, headers=headers)
