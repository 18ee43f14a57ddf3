"""The OpenAI-compatible door: /v1/chat/completions, /v1/completions, /v1/models.

The official `openai` client works with `base_url=<service>/v1` and an API key
of the service. Each call is a job (its `id` is the job's id: GET /jobs/<id>
shows it, /usage counts it); with `"stream": true` the answer is Server-Sent
Events, one `chat.completion.chunk` per piece of text as the worker makes it,
then `data: [DONE]` (with `stream_options.include_usage`, a last chunk carries
the usage). A client that goes away cancels its generation. Errors here are
OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`, shaped
in app.web.problems), with the statuses the other doors use.

The body is read here rather than by a schema: OpenAI's clients send fields
this door must name in its errors in OpenAI's terms (`param`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from app.operations.requests import JobRequest
from app.web.auth import authenticated, current_tenant
from app.web.context import services
from app.web.problems import Problem

# A plain Flask blueprint, outside /openapi.json: OpenAI's own API reference describes
# these routes, and their errors are OpenAI's objects, not problem+json.
blp = Blueprint("openai", __name__, url_prefix="/v1")

# OpenAI's fields this door maps onto the job's parameters.
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop")
# Fields OpenAI's clients may send that change nothing here at these values.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,), "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (False,),
    "user": (), "stream_options": (), "parallel_tool_calls": (), "store": (False,),
    "metadata": (), "service_tier": ("auto", "default"),
}  # fmt: skip


def _invalid(param: str, message: str) -> Problem:
    return Problem("validation-error", f"{param}: {message}", status=400, param=param)


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise Problem("malformed-request", "The request body must be a JSON object.", status=400)
    return body


def _job_request(body: dict[str, Any], inputs: dict[str, Any]) -> JobRequest:
    """The job of a call: the model, the inputs, the sampling parameters."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "expected the name of a model (GET /v1/models lists them)")
    known = {"model", "messages", "prompt", "stream", "max_tokens", "max_completion_tokens",
             *_SAMPLING, *_NEUTRAL}  # fmt: skip
    for name, value in body.items():
        if name not in known:
            raise _invalid(name, "is not supported by this service")
        if (
            name in _NEUTRAL
            and value is not None
            and _NEUTRAL[name]
            and value not in _NEUTRAL[name]
        ):
            raise _invalid(name, f"only {_NEUTRAL[name][0]!r} is supported")
    parameters = {name: body[name] for name in _SAMPLING if body.get(name) is not None}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        parameters["max_tokens"] = max_tokens
    return JobRequest(model, inputs, parameters=parameters)


def _streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _invalid("stream", "expected true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        raise _invalid("stream_options", 'expected {"include_usage": true|false}')
    return stream, bool(options.get("include_usage"))


@blp.get("/models")
@authenticated
def list_models() -> dict[str, Any]:
    """The generative models your key may use, as OpenAI's model list."""
    cards = services().completions.models(current_tenant())
    return {"object": "list", "data": [
        {"id": card.name, "object": "model", "created": 0, "owned_by": "inference-service"}
        for card in cards
    ]}  # fmt: skip


@blp.post("/chat/completions")
@authenticated
def chat_completions() -> Response | dict[str, Any]:
    """OpenAI's chat completion: `messages` in, the assistant's message out; with
    `stream: true`, Server-Sent Events of `chat.completion.chunk` objects."""
    body = _body()
    return _call(body, {"messages": body.get("messages")}, chat=True)


@blp.post("/completions")
@authenticated
def completions() -> Response | dict[str, Any]:
    """OpenAI's (legacy) text completion: a `prompt` continued."""
    body = _body()
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return _call(body, {"prompt": prompt}, chat=False)


def _call(body: dict[str, Any], inputs: dict[str, Any], *, chat: bool) -> Response | dict[str, Any]:
    stream, include_usage = _streaming(body)
    job_request = _job_request(body, inputs)
    operations, tenant = services().completions, current_tenant()
    if operations.card(tenant, job_request.model).generation is None:
        raise _invalid("model", f"{job_request.model} does not generate text (GET /v1/models)")
    job = operations.start(tenant, job_request)
    shape = _Shape(job.id, job_request.model, chat)
    if not stream:
        text = ""
        for followed in operations.follow(tenant, job.id):
            text += followed.text
            if followed.final is not None:
                return shape.whole(text, followed.final)
        raise AssertionError("a follow ends with its final message")

    def events() -> Iterator[str]:
        finished = False
        try:
            yield shape.sse(shape.chunk({"role": "assistant", "content": ""}, None))
            for followed in operations.follow(tenant, job.id):
                if followed.text:
                    yield shape.sse(shape.chunk({"content": followed.text}, None))
                if (final := followed.final) is not None:
                    finished = True
                    if final.get("status") not in ("succeeded", "cancelled"):
                        yield shape.sse({"error": shape.error(final)})
                    else:
                        yield shape.sse(shape.chunk({}, shape.reason(final)))
                        if include_usage:
                            yield shape.sse(shape.usage_chunk(final))
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (or the follow failed): stop generating
                operations.cancel(tenant, job.id)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Job-Id": str(job.id)}
    return Response(stream_with_context(events()), mimetype="text/event-stream", headers=headers)


class _Shape:
    """OpenAI's objects for one call: chat or text, whole or in chunks."""

    def __init__(self, job_id: uuid.UUID, model: str, chat: bool) -> None:
        self.id, self.model, self.chat = str(job_id), model, chat
        self.created = int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def reason(final: dict[str, Any]) -> str:
        reason = final.get("finish_reason") or "stop"
        return "length" if reason in ("length", "time_limit") else "stop"

    @staticmethod
    def usage(final: dict[str, Any]) -> dict[str, int]:
        usage = final.get("usage") or {}
        return {k: int(usage.get(k, 0)) for k in
                ("prompt_tokens", "completion_tokens", "total_tokens")}  # fmt: skip

    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]:
        if final.get("status") not in ("succeeded", "cancelled"):
            raise Problem("inference-failed", self.error(final)["message"], status=500)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": self.reason(final)}  # fmt: skip
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": self.reason(final)}  # fmt: skip
            kind = "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": self.usage(final)}

    def chunk(self, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": delta.get("content", ""), "logprobs": None,
                  "finish_reason": reason}  # fmt: skip
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, final: dict[str, Any]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": self.usage(final)}

    def error(self, final: dict[str, Any]) -> dict[str, Any]:
        message = final.get("error") or f"the generation ended {final.get('status')}"
        return {"message": f"job {self.id}: {message}", "type": "server_error",
                "param": None, "code": final.get("status")}  # fmt: skip

    @staticmethod
    def sse(data: dict[str, Any]) -> str:
        return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
