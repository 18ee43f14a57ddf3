"""OpenAI's objects for a generation: a request body read as a job's, and the
answer as OpenAI's `chat.completion` / `text_completion` (whole or in chunks) and
its error object.

One place for both the OpenAI-compatible door (app.web.openai) and the batch
lines of OpenAI's Batch format (app.batches.openai_format), so an answer in a
batch's output file is the body the door would have sent for the same line.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from app.cards.parameters import PARAMETERS
from app.generation.fields import BadField
from app.generation.tools import ToolPlan, call_id, plan, with_tools
from app.statuses import JobStatus

__all__ = [
    "BadField", "CompletionRequest", "CompletionShape", "ToolPlan", "completion_inputs",
    "completion_request", "error_object", "json_outputs", "streaming",
]  # fmt: skip

# Fields OpenAI's clients may send that change nothing here at these values.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "user": (), "stream_options": (), "parallel_tool_calls": (), "store": (False,),
    "metadata": (), "service_tier": ("auto", "default"),
}  # fmt: skip
# OpenAI's fields that carry the job's parameters (app.cards.parameters; vLLM's extra
# `top_k`, `repetition_penalty` and this service's `labels`, to score, among them).
_PARAMETER_FIELDS = tuple(name for parameter in PARAMETERS for name in parameter.openai)
_KNOWN = {"model", "messages", "prompt", "stream", "tools", "tool_choice", "n",
          *_PARAMETER_FIELDS, *_NEUTRAL}  # fmt: skip


@dataclass(frozen=True)
class CompletionRequest:
    """A body as a job's request: the model, the inputs, the sampling parameters."""

    model: str
    inputs: dict[str, Any]
    parameters: dict[str, Any]
    tools: ToolPlan | None = None  # how the answer becomes tool calls
    n: int = 1  # choices: as many jobs of the same request (a seed moved on by each)


def completion_inputs(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The job's inputs: a chat's `messages`, or a text completion's one `prompt`."""
    if chat:
        return {"messages": body.get("messages")}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return {"prompt": prompt}


def completion_request(body: dict[str, Any], chat: bool) -> CompletionRequest:
    """The job of a body; BadField names a field this service does not take (the
    inputs and parameters are checked against the model by the job's own checks)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadField("model", "expected the name of a model (GET /v1/models lists them)")
    for name, value in body.items():
        if name not in _KNOWN:
            raise BadField(name, "is not supported by this service")
        allowed = _NEUTRAL.get(name)
        if allowed and value is not None and value not in allowed:
            raise BadField(name, f"only {allowed[0]!r} is supported")
    parameters = _parameters(body)
    if not chat:
        parameters |= _legacy_logprobs(body.get("logprobs"))
    tools, tool_format, told = plan(body) if chat else (None, None, None)
    if tool_format is not None:
        if "response_format" in parameters:
            raise BadField("response_format", "a required or named tool_choice shapes the "
                           "answer as the call's arguments: leave out response_format")  # fmt: skip
        parameters["response_format"] = tool_format
    inputs = completion_inputs(body, chat)
    if chat:
        inputs["messages"] = with_tools(inputs["messages"], told)
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadField("n", "expected an integer of 1 or more (the model's card sets the most)")
    if n > 1 and "labels" in parameters:
        raise BadField("n", "labels are scored once: leave n out")
    return CompletionRequest(model, inputs, parameters, tools, n)


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    """The job's parameters: each from the first of its OpenAI fields the body has
    (`max_completion_tokens` before `max_tokens`), left out when that one is null."""
    found = {}
    for parameter in PARAMETERS:
        value = next((body[name] for name in parameter.openai if name in body), None)
        if value is not None:
            found[parameter.name] = value
    return found


def _legacy_logprobs(wanted: Any) -> dict[str, Any]:
    """A text completion's `logprobs` as a number of alternatives (OpenAI's legacy
    form) as the job's `logprobs` and `top_logprobs`; true or false as it is."""
    if wanted is None or isinstance(wanted, bool):
        return {}
    if not isinstance(wanted, int) or not 0 <= wanted <= 5:
        raise BadField("logprobs", "expected an integer from 0 to 5 (the alternatives per token)")
    return {"logprobs": True, "top_logprobs": wanted}


def streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    """Whether to stream, and whether the stream ends with a usage chunk."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadField("stream", "expected true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        raise BadField("stream_options", 'expected {"include_usage": true|false}')
    return stream, bool(options.get("include_usage"))


JSON_OUTPUTS = ("logprobs", "label_scores")  # a generation's outputs kept as JSON text


def json_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """A finished generation's JSON outputs (log-probabilities, label scores), read
    for its final message, as the worker's own final message carries them."""
    return {name: json.loads(outputs[name]) for name in JSON_OUTPUTS if name in outputs}


def error_object(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error object (`{"error": {...}}`) for an answer of this HTTP status."""
    kind = (
        "authentication_error" if status == 401
        else "permission_error" if status == 403
        else "not_found_error" if status == 404
        else "rate_limit_error" if status == 429
        else "server_error" if status >= 500
        else "invalid_request_error"
    )  # fmt: skip
    code = code.replace("-", "_")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class CompletionShape:
    """OpenAI's objects for one call: chat or text, whole or in chunks. `created`:
    when the answer was made (now, by default)."""

    def __init__(
        self, job_id: uuid.UUID, model: str, chat: bool, created: int | None = None,
        tools: ToolPlan | None = None,
    ) -> None:  # fmt: skip
        self.id, self.model, self.chat = str(job_id), model, chat
        self.tools, self._call_id = tools, call_id(job_id)
        self.created = int(time.time()) if created is None else created
        # (a text completion's logprobs: where each choice's next token begins)
        self._offsets: dict[int, int] = {}

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

    @staticmethod
    def succeeded(final: dict[str, Any]) -> bool:
        return final.get("status") in (JobStatus.SUCCEEDED, JobStatus.CANCELLED)

    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]:
        """The whole answer of a call that succeeded (or was cancelled: its text so far)."""
        return self.whole_many([(text, final)])

    def whole_many(self, answers: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """The whole answer of `n` choices (each its text and final message); the
        prompt counted once, the completions of all."""
        choices = []
        for index, (text, final) in enumerate(answers):
            logprobs = self.logprobs(final.get("logprobs"), index)
            if self.chat:
                message, reason = self.message(text, final)
                choice = {"index": index, "message": message, "logprobs": logprobs,
                          "finish_reason": reason}  # fmt: skip
            else:
                choice = {"index": index, "text": text, "logprobs": logprobs,
                          "finish_reason": self.reason(final)}  # fmt: skip
            if "label_scores" in final:  # (a scored request: each label's probability)
                choice["label_scores"] = final["label_scores"]
            choices.append(choice)
        usage = self.total_usage([final for _, final in answers])
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": choices, "usage": usage}

    def message(self, text: str, final: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The assistant's message and finish reason: its text, or its tool calls."""
        calls = self.tools.calls(text, self._call_id) if self.tools else None
        if calls is None or not self.succeeded(final) or final.get("status") == JobStatus.CANCELLED:
            return {"role": "assistant", "content": text}, self.reason(final)
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def whole_delta(self, text: str, final: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """A streamed call with tools: its whole answer as one delta (a call's JSON
        is known to be one only once it is whole)."""
        message, reason = self.message(text, final)
        if "tool_calls" not in message:
            return {"content": text}, reason
        return {"tool_calls": [{"index": i, **call} for i, call in
                               enumerate(message["tool_calls"])]}, reason  # fmt: skip

    def chunk(
        self, delta: dict[str, Any], reason: str | None, logprobs: Any = None, index: int = 0
    ) -> dict[str, Any]:
        shaped = self.logprobs(logprobs, index) if logprobs else None
        if self.chat:
            choice = {"index": index, "delta": delta, "logprobs": shaped, "finish_reason": reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": delta.get("content", ""), "logprobs": shaped,
                  "finish_reason": reason}  # fmt: skip
        return {**self._head("text_completion"), "choices": [choice]}

    def logprobs(self, entries: Any, index: int = 0) -> dict[str, Any] | None:
        """Tokens' log-probabilities (the worker's are a chat's `content` items) in
        this call's shape: a chat's, or a text completion's legacy columns, whose
        `text_offset` goes on from the tokens shaped before in this call."""
        if entries is None:
            return None
        if self.chat:
            return {"content": list(entries), "refusal": None}
        offsets = []
        for entry in entries:
            offsets.append(self._offsets.get(index, 0))
            self._offsets[index] = offsets[-1] + len(entry["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
            ],
            "text_offset": offsets,
        }

    def usage_chunk(self, finals: list[dict[str, Any]]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": self.total_usage(finals)}

    def total_usage(self, finals: list[dict[str, Any]]) -> dict[str, int]:
        """The usage of `n` choices: the prompt counted once, the completions of all."""
        usage = self.usage(finals[0]) if finals else self.usage({})
        usage["completion_tokens"] = sum(self.usage(f)["completion_tokens"] for f in finals)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def error(self, final: dict[str, Any]) -> dict[str, Any]:
        """A stream's error event for a generation that failed."""
        message = final.get("error") or f"the generation ended {final.get('status')}"
        return {"message": f"job {self.id}: {message}", "type": "server_error",
                "param": None, "code": final.get("status")}  # fmt: skip

    @staticmethod
    def sse(data: dict[str, Any]) -> str:
        return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
