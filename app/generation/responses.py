"""OpenAI's Responses objects: a create body read as a generation job's request, and
the job shown as a `response`, its input items and its stream of events.

A response is a job of a generative model whose request keeps a record beside
it (JobRequest.record): this request's own input items, its instructions, its
text format, the response it follows and its metadata. Its messages are the
instructions (as the system message), the conversation of the response it
follows (that one's messages and answer; not its instructions, as OpenAI
does), then its own items.

Its events are numbered so that a stream resumed `starting_after` a number gets
every event after it once, whatever pieces the text came in: 0 to 3 open the
response, its message and its text part; a delta ending at character `e` of the
text is numbered 3 + e; the closing events follow the text's length.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from app.cards.parameters import PARAMETERS
from app.generation.fields import BadField
from app.statuses import JobStatus

PREFIX = "resp_"
MAX_METADATA = 16  # keys, as OpenAI allows
_IGNORED = ("user", "store", "service_tier", "truncation", "parallel_tool_calls", "include",
            "safety_identifier", "prompt_cache_key", "reasoning", "stream_options",
            "top_logprobs")  # fmt: skip
# The job's parameters a create body carries (app.cards.parameters): their names here
# to the job's; a response shows them back under the same names.
_TAKEN = {parameter.responses: parameter.name for parameter in PARAMETERS if parameter.responses}
_KNOWN = {"model", "input", "instructions", "previous_response_id", "text", "background",
          "stream", "metadata", "webhook", "tools", "tool_choice", *_TAKEN,
          *_IGNORED}  # fmt: skip
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def response_id(job_id: uuid.UUID) -> str:
    return f"{PREFIX}{job_id.hex}"


def job_id_of(value: str) -> uuid.UUID | None:
    """The job of a response id (`resp_<hex>`), None for anything else."""
    if not value.startswith(PREFIX):
        return None
    try:
        return uuid.UUID(hex=value[len(PREFIX) :])
    except ValueError:
        return None


@dataclass(frozen=True)
class ResponseAsk:
    """A create body, read: what the job is made of, and how the caller waits."""

    model: str
    items: list[dict[str, str]]  # this request's input, as messages
    instructions: str | None
    previous: uuid.UUID | None
    parameters: dict[str, Any]  # the job's (sampling, response_format)
    text_format: dict[str, Any]
    background: bool
    stream: bool
    metadata: dict[str, str]
    webhook: dict[str, Any] | None

    def record(self) -> dict[str, Any]:
        return {"items": self.items, "instructions": self.instructions,
                "previous_response_id": response_id(self.previous) if self.previous else None,
                "text": {"format": self.text_format}, "metadata": self.metadata,
                "background": self.background, "parameters": self.parameters}  # fmt: skip


def read_create(body: dict[str, Any]) -> ResponseAsk:
    """The body of POST /v1/responses; BadField names what is wrong."""
    if unknown := sorted(set(body) - _KNOWN):
        raise BadField(unknown[0], "is not supported by this service")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadField("model", "expected the name of a model (GET /v1/models lists them)")
    if body.get("tools"):
        raise BadField("tools", "tools are taken at /v1/chat/completions; not on responses")
    if body.get("store") is False and body.get("background"):
        raise BadField("store", "a background response is stored: leave store out or true")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadField("instructions", "expected a string")
    previous = body.get("previous_response_id")
    previous_job = None
    if previous is not None:
        previous_job = job_id_of(previous) if isinstance(previous, str) else None
        if previous_job is None:
            raise BadField("previous_response_id", f"expected a response id ({PREFIX}...)")
    text_format = _text_format(body.get("text"))
    parameters: dict[str, Any] = {
        name: body[field] for field, name in _TAKEN.items() if body.get(field) is not None
    }
    if text_format["type"] != "text":
        parameters["response_format"] = _chat_format(text_format)
    for name in ("background", "stream"):
        if not isinstance(body.get(name, False), bool):
            raise BadField(name, "expected true or false")
    return ResponseAsk(
        model, _items(body.get("input")), instructions, previous_job, parameters, text_format,
        bool(body.get("background")), bool(body.get("stream")), _metadata(body.get("metadata")),
        _webhook(body.get("webhook")),
    )  # fmt: skip


def _items(raw: Any) -> list[dict[str, str]]:
    """OpenAI's `input`: a string, or a list of messages (content a string or
    input_text parts)."""
    if isinstance(raw, str) and raw:
        return [{"role": "user", "content": raw}]
    expected = 'a string, or a list of {"role", "content"} messages'
    if not isinstance(raw, list) or not raw:
        raise BadField("input", f"expected {expected}")
    items = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise BadField(where, f"expected a message: {expected}")
        role, content = item.get("role"), item.get("content")
        if role not in _ROLES:
            raise BadField(f"{where}.role", f"expected one of {sorted(_ROLES)}")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                       and isinstance(p.get("text"), str) for p in content):  # fmt: skip
                raise BadField(f"{where}.content", "expected text parts (input_text)")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadField(f"{where}.content", "expected a string or a list of text parts")
        items.append({"role": _ROLES[role], "content": content})
    return items


def _text_format(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {"type": "text"}
    shape = raw.get("format", {"type": "text"}) if isinstance(raw, dict) else None
    if not isinstance(shape, dict) or shape.get("type") not in ("text", "json_object",
                                                                  "json_schema"):  # fmt: skip
        raise BadField("text.format", 'expected {"type": "text" | "json_object" | "json_schema"}')
    return shape


def _chat_format(shape: dict[str, Any]) -> dict[str, Any]:
    """The Responses' text format as the chat's `response_format` (the job's)."""
    if shape["type"] != "json_schema":
        return {"type": shape["type"]}
    spec = {k: shape[k] for k in ("name", "schema", "strict") if k in shape}
    return {"type": "json_schema", "json_schema": spec}


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if (
        not isinstance(raw, dict)
        or len(raw) > MAX_METADATA
        or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in raw.items()
        )
    ):
        raise BadField("metadata", f"expected at most {MAX_METADATA} string keys (64 characters) "
                       "to strings (512)")  # fmt: skip
    return dict(raw)


def _webhook(raw: Any) -> dict[str, Any] | None:
    """This service's extra field: where the response's job events are POSTed."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
        raise BadField("webhook", 'expected {"url": "https://...", "events": [...]}')
    return raw


def messages(ask: ResponseAsk, history: list[dict[str, str]]) -> list[dict[str, str]]:
    """The job's messages: the instructions, the conversation so far, the input."""
    system = [{"role": "system", "content": ask.instructions}] if ask.instructions else []
    return [*system, *history, *ask.items]


STATUSES: dict[str, str] = {JobStatus.QUEUED: "queued", JobStatus.RUNNING: "in_progress",
            JobStatus.SUCCEEDED: "completed", JobStatus.FAILED: "failed",
            JobStatus.CANCELLED: "cancelled", JobStatus.EXPIRED: "failed"}  # fmt: skip


@dataclass(frozen=True)
class Shown:
    """What a response object is made of: its job's fields, its record, its text."""

    job_id: uuid.UUID
    model: str
    status: str  # the job's
    created_at: float
    record: dict[str, Any]
    text: str
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    error: str | None = None
    completed_at: float | None = None


def response_object(shown: Shown) -> dict[str, Any]:
    """The job as OpenAI's `response` object."""
    status = STATUSES.get(shown.status, "in_progress")
    incomplete = None
    if status == "completed" and shown.finish_reason in ("length", "time_limit"):
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    record, usage = shown.record, shown.usage or {}
    message_status = "completed" if status == "completed" else (
        "in_progress" if status in ("queued", "in_progress") else "incomplete")  # fmt: skip
    output = [] if not shown.text and status in ("queued", "in_progress") else [
        message_item(shown.job_id, shown.text, message_status)]  # fmt: skip
    parameters = record.get("parameters") or {}
    return {
        "id": response_id(shown.job_id), "object": "response", "created_at": shown.created_at,
        "completed_at": shown.completed_at, "status": status,
        "background": record.get("background"),
        "model": shown.model, "instructions": record.get("instructions"), "output": output,
        "previous_response_id": record.get("previous_response_id"),
        "error": {"code": "server_error", "message": shown.error} if status == "failed" else None,
        "incomplete_details": incomplete, "metadata": record.get("metadata") or {},
        "text": record.get("text") or {"format": {"type": "text"}},
        **{field: parameters.get(name) for field, name in _TAKEN.items()},
        "parallel_tool_calls": False,
        "tool_choice": "none", "tools": [],
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0),
        } if usage else None,
    }  # fmt: skip


def message_item(job_id: uuid.UUID, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    content = [part] if text or status != "in_progress" else []
    return {"id": f"msg_{job_id.hex}", "type": "message", "status": status,
            "role": "assistant", "content": content}  # fmt: skip


def input_items(job_id: uuid.UUID, record: dict[str, Any]) -> list[dict[str, Any]]:
    """This request's input items, as OpenAI lists them (oldest first)."""
    return [{"id": f"msg_{job_id.hex}_{i}", "type": "message", "role": item["role"],
             "status": "completed",
             "content": [{"type": "input_text", "text": item["content"]}]}
            for i, item in enumerate(record.get("items") or [])]  # fmt: skip


class ResponseEvents:
    """A response's stream events in order, numbered as the module says; those at
    or before `after` are left out (a stream resumed)."""

    OPENED = 4  # events before the first delta

    def __init__(self, job_id: uuid.UUID, after: int = -1) -> None:
        self.job_id, self.after, self.text = job_id, after, ""
        self._item = f"msg_{job_id.hex}"

    def opening(self, shown: Shown) -> list[dict[str, Any]]:
        snapshot = response_object(shown)
        item = {**message_item(self.job_id, "", "in_progress"), "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": snapshot},
            {"type": "response.in_progress", "response": {**snapshot, "status": "in_progress"}},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.content_part.added", "item_id": self._item, "output_index": 0,
             "content_index": 0, "part": part},
        ]  # fmt: skip
        return self._after([{**e, "sequence_number": n} for n, e in enumerate(events)])

    def delta(self, text: str) -> list[dict[str, Any]]:
        """New text: one delta, numbered by where it ends; only what the resumed
        caller has not had."""
        start, self.text = len(self.text), self.text + text
        end = len(self.text)
        had = self.after - (self.OPENED - 1)  # characters the caller has
        if not text or end <= had:
            return []
        delta = self.text[max(start, had) : end]
        return [{"type": "response.output_text.delta", "item_id": self._item, "output_index": 0,
                 "content_index": 0, "delta": delta, "logprobs": [],
                 "sequence_number": self.OPENED - 1 + end}]  # fmt: skip

    def closing(self, shown: Shown) -> list[dict[str, Any]]:
        snapshot = response_object(shown)
        done = snapshot["output"][0] if snapshot["output"] else message_item(
            self.job_id, self.text, "incomplete")  # fmt: skip
        empty = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
        part = done["content"][0] if done["content"] else empty
        ending = {"completed": "response.completed", "incomplete": "response.incomplete",
                  "cancelled": "response.incomplete"}  # fmt: skip
        ending_type = ending.get(snapshot["status"], "response.failed")
        events: list[dict[str, Any]] = [
            {"type": "response.output_text.done", "item_id": self._item, "output_index": 0,
             "content_index": 0, "text": part["text"], "logprobs": []},
            {"type": "response.content_part.done", "item_id": self._item, "output_index": 0,
             "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            {"type": ending_type, "response": snapshot},
        ]  # fmt: skip
        first = self.OPENED + len(part["text"])
        return self._after([{**e, "sequence_number": first + n} for n, e in enumerate(events)])

    def _after(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in events if e["sequence_number"] > self.after]
