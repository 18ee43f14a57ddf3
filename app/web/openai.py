"""The OpenAI-compatible door: /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/models.

The official `openai` client works with `base_url=<service>/v1` and an API key
of the service. Each call is a job (its `id` is the job's id: GET /jobs/<id>
shows it, /usage counts it); with `"stream": true` the answer is Server-Sent
Events, one `chat.completion.chunk` per piece of text as the worker makes it,
then `data: [DONE]` (with `stream_options.include_usage`, a last chunk carries
the usage). A client that goes away cancels its generation. Errors here are
OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`, shaped
in app.web.problems), with the statuses the other doors use.

The body is read here rather than by a schema: OpenAI's clients send fields
this door must name in its errors in OpenAI's terms (`param`). OpenAI's objects
are shaped in app.generation.openai_objects, which batches in OpenAI's Batch
format share (their routes, /v1/files and /v1/batches: app.web.openai_batches).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from app.operations.completions import BadField, CompletionShape, completion_request, streaming
from app.operations.requests import JobRequest
from app.web.auth import authenticated, current_tenant
from app.web.context import services
from app.web.problems import Problem

# A plain Flask blueprint, outside /openapi.json: OpenAI's own API reference describes
# these routes, and their errors are OpenAI's objects, not problem+json.
blp = Blueprint("openai", __name__, url_prefix="/v1")


def invalid(param: str, message: str) -> Problem:
    return Problem("validation-error", f"{param}: {message}", status=400, param=param)


def json_body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise Problem("malformed-request", "The request body must be a JSON object.", status=400)
    return body


@blp.get("/models")
@authenticated
def list_models() -> dict[str, Any]:
    """The generative models your key may use, as OpenAI's model list."""
    cards = services().openai.completions.models(current_tenant())
    return {"object": "list", "data": [
        {"id": card.name, "object": "model", "created": 0, "owned_by": "inference-service"}
        for card in cards
    ]}  # fmt: skip


@blp.post("/chat/completions")
@authenticated
def chat_completions() -> Response | dict[str, Any]:
    """OpenAI's chat completion: `messages` in, the assistant's message out; with
    `stream: true`, Server-Sent Events of `chat.completion.chunk` objects."""
    return _call(json_body(), chat=True)


@blp.post("/completions")
@authenticated
def completions() -> Response | dict[str, Any]:
    """OpenAI's (legacy) text completion: a `prompt` continued."""
    return _call(json_body(), chat=False)


@blp.post("/embeddings")
@authenticated
def embeddings() -> tuple[dict[str, Any], int, dict[str, str]]:
    """OpenAI's embeddings: `input` (a string, strings or token arrays) to vectors,
    `encoding_format` float or base64 (little-endian float32)."""
    body = json_body()
    model, encoding = body.get("model"), body.get("encoding_format", "float")
    if not isinstance(model, str) or not model:
        raise invalid("model", "expected the name of an embedding model")
    if encoding not in ("float", "base64"):
        raise invalid("encoding_format", 'expected "float" or "base64"')
    if unknown := sorted(set(body) - {"model", "input", "encoding_format", "dimensions", "user"}):
        raise invalid(unknown[0], "is not supported by this service")
    try:
        made = services().openai.embeddings.embed(
            current_tenant(), model, body.get("input"), body.get("dimensions")
        )
    except BadField as exc:
        raise invalid(exc.param, exc.message) from None
    data = [
        {"object": "embedding", "index": i, "embedding": (
            base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64"
            else vector.tolist())}
        for i, vector in enumerate(made.vectors)
    ]  # fmt: skip
    usage = {"prompt_tokens": made.tokens, "total_tokens": made.tokens}
    headers = {"X-Job-Id": str(made.job_id)} if made.job_id else {}
    return {"object": "list", "data": data, "model": model, "usage": usage}, 200, headers


def _call(body: dict[str, Any], *, chat: bool) -> Response | dict[str, Any]:
    try:
        stream, include_usage = streaming(body)
        asked = completion_request(body, chat)
    except BadField as exc:
        raise invalid(exc.param, exc.message) from None
    job_request = JobRequest(asked.model, asked.inputs, parameters=asked.parameters)
    operations, tenant = services().openai.completions, current_tenant()
    card = operations.card(tenant, job_request.model)  # (resolved once for the request)
    if card.generation is None:
        raise invalid("model", f"{job_request.model} does not generate text (GET /v1/models)")
    try:
        jobs = operations.start_many(tenant, card, job_request, asked.n)
    except BadField as exc:
        raise invalid(exc.param, exc.message) from None
    job_ids = [job.id for job in jobs]
    shape = CompletionShape(job_ids[0], job_request.model, chat, tools=asked.tools)
    if not stream:
        texts = [""] * len(jobs)
        finals: list[dict[str, Any]] = [{} for _ in jobs]
        for index, followed in operations.follow_many(tenant, job_ids):
            texts[index] += followed.text
            if (final := followed.final) is not None:
                if not shape.succeeded(final):
                    operations.cancel_many(tenant, job_ids)
                    raise Problem("inference-failed", shape.error(final)["message"], status=500)
                finals[index] = final
        return shape.whole_many(list(zip(texts, finals, strict=True)))

    def events() -> Iterator[str]:
        ended = 0
        try:
            for index in range(len(job_ids)):
                yield shape.sse(
                    shape.chunk({"role": "assistant", "content": ""}, None, index=index)
                )
            held = [""] * len(job_ids)  # a call with tools: its answer goes whole
            finals: list[dict[str, Any]] = []
            for index, followed in operations.follow_many(tenant, job_ids):
                if shape.tools is not None:
                    held[index] += followed.text
                elif followed.text or followed.logprobs:
                    delta = {"content": followed.text}
                    yield shape.sse(shape.chunk(delta, None, followed.logprobs, index))
                if (final := followed.final) is None:
                    continue
                ended += 1
                finals.append(final)
                if not shape.succeeded(final):
                    yield shape.sse({"error": shape.error(final)})
                    continue
                reason = shape.reason(final)
                if shape.tools is not None:
                    delta, reason = shape.whole_delta(held[index], final)
                    yield shape.sse(shape.chunk(delta, None, final.get("logprobs"), index))
                yield shape.sse(shape.chunk({}, reason, index=index))
            if include_usage:
                yield shape.sse(shape.usage_chunk(finals))
            yield "data: [DONE]\n\n"
        finally:
            if ended < len(job_ids):  # the client went away (or a follow failed): stop
                operations.cancel_many(tenant, job_ids)

    ids = ",".join(str(job_id) for job_id in job_ids)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Job-Id": ids}
    return Response(stream_with_context(events()), mimetype="text/event-stream", headers=headers)
