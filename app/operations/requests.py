"""The typed requests the operations take: what a door decoded from its protocol.

Each door (HTTP, KServe v2 over HTTP and gRPC, the stream door, the CLI) fills
these and hands them over with the caller's tenant (`TenantRef`); nothing here
knows a header, a status code or a protobuf.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict

from app.jobs.staging import Webhook

__all__ = [
    "BatchRequest",
    "BindingFields",
    "EntryRequest",
    "InferRequest",
    "JobQuery",
    "JobRequest",
    "ScheduleFields",
    "ScheduleInput",
    "Wait",
    "Webhook",
]


@dataclass(frozen=True, slots=True)
class JobRequest:
    """An async job: `inputs` as `{"<input>": nested list}` or KServe v2 tensors.
    `priority` 0-9 within the tenant's allowance; `deadline` ends the job
    `expired` if unfinished by then; an `idempotency_key` makes a repeat return
    the first job."""

    model: str
    inputs: Any
    version: str | None = None
    priority: int = 0
    # A generative model's sampling parameters (app.generation.requests); None elsewhere.
    parameters: Any = None
    deadline: datetime | None = None
    idempotency_key: str | None = None
    webhook: Webhook | None = None
    # A sync call's job: the channel its worker sends the answer to (set by the
    # call operations, never by a client).
    reply_to: str | None = None
    # What a door keeps beside the inputs and reads back itself (the Responses
    # door's input items, instructions, format); the worker reads none of it.
    record: dict[str, Any] | None = None
    # The W3C trace context the request came with (app.observability.tracing).
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A sync call: its outputs within `timeout_s` (None: SYNC_TIMEOUT_SECONDS;
    at most MAX_WAIT_SECONDS either way). `deadline` ends its job `expired` if
    unfinished by then (a gRPC call's deadline: nobody waits for it after)."""

    model: str
    inputs: Any
    version: str | None = None
    timeout_s: float | None = None
    deadline: datetime | None = None
    # A generative model's sampling parameters (the request's own, as Triton's vLLM
    # backend takes them); None elsewhere.
    parameters: Any = None
    traceparent: str | None = None  # the W3C trace context the call came with


@dataclass(frozen=True, slots=True)
class JobQuery:
    """A page of a tenant's jobs, newest first; `cursor` from the previous page."""

    limit: int
    status: str | None = None
    model: str | None = None
    cursor: str | None = None
    outputs: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """How long to wait for a job, and for what: its next `change` (long-poll)
    or until it is `finished` (`Prefer: wait`)."""

    seconds: float
    until: Literal["change", "finished"] = "change"


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """Many rows of one model: inline `inputs` (rows along the first axis) or an
    uploaded file (`file_id`), exactly one; a webhook for the batch's end."""

    model: str
    version: str | None = None
    inputs: Any = None
    file_id: uuid.UUID | None = None
    webhook: Webhook | None = None
    # A file in OpenAI's Batch format: OpenAI's fields (endpoint, input_file_id, metadata).
    openai: dict[str, Any] | None = None


class ScheduleInput(TypedDict, total=False):
    """A schedule's input: an uploaded file, or a path in the tenant's data area."""

    file_id: uuid.UUID | None
    path: str | None


class ScheduleFields(TypedDict, total=False):
    """A schedule's fields; on an update only those given change (a new cron, time
    zone or resume starts from the next tick)."""

    name: str
    cron: str
    timezone: str
    model: str
    version: str | None
    input: ScheduleInput
    output: str | None
    paused: bool


class BindingFields(TypedDict, total=False):
    """A stream binding's fields; on an update only those given change (`input`
    never does). Log names are short (`requests`) or full under the tenant's prefix."""

    model: str
    version: str | None
    input: str
    output: str
    paused: bool


@dataclass(frozen=True, slots=True)
class EntryRequest:
    """An input entry of the stream door, decoded: its id in its log, the caller's
    `request_id` (its `id` field), `inputs` as a job's; `priority` 0-9 within the
    tenant's allowance; `model` and `version` only where the entry names another
    model than its binding's; `parameters` (a generative model's sampling
    parameters) as a job's."""

    entry_id: str
    request_id: str
    inputs: Any
    priority: int = 0
    model: str | None = None
    version: str | None = None
    parameters: Any = None
    traceparent: str | None = None  # the entry's `traceparent` field, if any
