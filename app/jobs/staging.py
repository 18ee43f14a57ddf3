"""New jobs: their inputs checked against the model's card, their columns, and
their rows staged in the caller's transaction (the submit operations commit, then
wake the model's workers)."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy.orm import Session

from app.cards import ModelCard
from app.errors import InputsDoNotFit, InvalidRequest
from app.jobs.inserts import INSERT_JOB, INSERT_JOBS
from app.jobs.tables import SYNC_PRIORITY, Job
from app.runtime.tensors import InvalidInputs, pack, parse_inputs, unpack
from app.statuses import JobStatus

if TYPE_CHECKING:  # imported where used: one-shot jobs never load the tokenizer
    from app.generation.requests import GenerationRequest


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a job's events are POSTed, and which (`job.succeeded`, ...)."""

    url: str
    events: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Terms:
    """How a new job runs, besides its inputs: its priority (SYNC_PRIORITY for a
    sync call), deadline, webhook, attempt cap, and a sync call's reply channel
    (app.sync.replies)."""

    priority: int = 0
    deadline: datetime | None = None
    webhook: Webhook | None = None
    max_attempts: int = 3
    reply_to: str | None = None
    traceparent: str | None = None  # the trace its spans join (admission's span)


RECORD = "record"  # a door's own record beside a job's inputs (JobRequest.record)


def record_array(record: dict[str, Any]) -> np.ndarray:
    return np.array([json.dumps(record, separators=(",", ":"))], dtype=object)


def stored_record(input_data: bytes | None) -> dict[str, Any] | None:
    """The record a door kept beside the job's inputs, None without one."""
    if not input_data:
        return None
    found = unpack(input_data).get(RECORD)
    return None if found is None else dict(json.loads(found[0]))


def job_values(
    card: ModelCard, arrays: dict[str, np.ndarray], tenant_id: int, terms: Terms
) -> dict[str, Any]:
    """A new queued job's columns. A card may set its own `max_attempts`."""
    webhook = terms.webhook
    return {
        "id": uuid.uuid4(),
        "tenant_id": tenant_id,
        "model": card.name,
        "model_version": card.version,
        "status": JobStatus.QUEUED,
        "input_data": pack(arrays),
        "batch_rows": batch_rows(card, arrays),
        "priority": terms.priority,
        "attempts": 0,
        "max_attempts": int(card.extra.get("max_attempts", terms.max_attempts)),
        "deadline_at": terms.deadline,
        "webhook_url": webhook.url if webhook else None,
        "webhook_events": list(webhook.events) if webhook else None,
        "reply_to": terms.reply_to,
        "traceparent": terms.traceparent,
    }


def stage(session: Session, values: dict[str, Any]) -> Job:
    """Insert the job row in the session's transaction; the caller commits.

    A Core INSERT: the ORM's unit of work cost a third of a submit."""
    defaults = session.connection().execute(INSERT_JOB, values).one()._asdict()
    return Job(**values, **defaults)


def stage_many(session: Session, values: list[dict[str, Any]]) -> list[Job]:
    """Insert many job rows in one statement in the session's transaction, in the
    order given; the caller commits."""
    rows = session.connection().execute(INSERT_JOBS, values).all()
    defaults = {row.id: row._asdict() for row in rows}
    return [Job(**v, **{k: x for k, x in defaults[v["id"]].items() if k != "id"}) for v in values]


def call_record(
    model: tuple[str, str],
    rows: int,
    tenant_id: int,
    started_at: datetime,
    compute_seconds: float,
    *,
    outputs: dict[str, np.ndarray] | None = None,
    error: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The record of a sync call answered without a job row first (inline, or on
    the sync lane): a finished job of `model` (name, version; its card may be
    gone since), written once. Cheaper than a job: no inputs kept (nothing will
    run it again), one INSERT."""
    return {
        "id": uuid.uuid4(),
        "tenant_id": tenant_id,
        "model": model[0],
        "model_version": model[1],
        "status": JobStatus.SUCCEEDED if error is None else JobStatus.FAILED,
        "output_data": pack(outputs) if outputs is not None else None,
        "error_code": error[0] if error else None,
        "error_message": error[1] if error else None,
        "batch_rows": rows,
        "priority": SYNC_PRIORITY,
        "attempts": 1,
        "max_attempts": 1,
        "batch_share": 1.0,
        "compute_seconds": compute_seconds,
        "created_at": started_at,
        "started_at": started_at,
        "finished_at": datetime.now(UTC),
        "enqueued_at": None,
    }


def check_inputs(card: ModelCard, inputs: Any, parameters: Any = None) -> dict[str, np.ndarray]:
    """The inputs as arrays of the card's datatypes (a generative model's: its request,
    checked and its prompt's length measured); InputsDoNotFit names each misfit."""
    try:
        if card.generation is not None:
            return generation_arrays(card, inputs, parameters)
        if parameters is not None:
            raise InvalidInputs({"parameters": f"model {card.ref} takes no parameters; only "
                                 "generative models do"})  # fmt: skip
        return parse_inputs(card, inputs)
    except InvalidInputs as exc:
        raise InputsDoNotFit(
            f"inputs do not match model {card.ref}: {exc}",
            errors=exc.errors,
            expected=[spec.to_dict() for spec in card.inputs],
        ) from None


def generation_arrays(card: ModelCard, inputs: Any, parameters: Any) -> dict[str, np.ndarray]:
    from app.generation.requests import parse, request_arrays

    assert card.generation is not None
    return request_arrays(measured(card, parse(card.generation, _text_input(inputs), parameters)))


MAX_ROW_ERRORS = 20  # misfits a refused batch names


def check_rows(card: ModelCard, inputs: Any) -> dict[str, np.ndarray]:
    """A batch's inline rows as arrays: a one-shot model's as a job's inputs (rows
    along the first axis); a generative model's as a list of requests, each as a
    job's body without the model, every row checked (`inputs[i].<field>` names a
    misfit)."""
    if card.generation is None:
        return check_inputs(card, inputs)
    from app.generation.requests import request_arrays

    if not isinstance(inputs, list) or not inputs:
        raise InputsDoNotFit(
            f"model {card.ref} generates: a batch's inputs are a non-empty list of requests",
            errors={"inputs": ['a list of {"inputs": {"messages" or "prompt"}, "parameters"}']},
        )
    requests = []
    errors: dict[str, str] = {}
    for i, row in enumerate(inputs):
        try:
            requests.append(checked_request(card, row))
        except InvalidInputs as exc:
            errors |= {f"inputs[{i}].{field}": problem for field, problem in exc.errors.items()}
            if len(errors) >= MAX_ROW_ERRORS:
                break  # enough to fix the first rows by; the rest are not read
    if errors:
        raise InputsDoNotFit(f"rows do not fit model {card.ref}: {errors}", errors=errors)
    return request_arrays(*requests)


def checked_request(card: ModelCard, row: Any) -> GenerationRequest:
    """A batch's row of a generative model (a job's body without the model), parsed
    and its prompt measured against the context; InvalidInputs names a misfit."""
    from app.generation.requests import parse_row

    assert card.generation is not None
    return measured(card, parse_row(card.generation, row))


def measured(card: ModelCard, request: GenerationRequest) -> GenerationRequest:
    """The request with its prompt's ids, measured against the context
    (InvalidInputs past it): the worker starts from them."""
    from app.generation.formats import chat_format

    return replace(request, prompt_ids=tuple(chat_format(card).encode(request)))


def _text_input(inputs: Any) -> Any:
    """KServe v2's form of a prompt (Triton's vLLM backend): one BYTES `text_input`,
    as a tensor list or `{"text_input": [...]}`; other forms are left to `parse`."""
    if isinstance(inputs, list) and len(inputs) == 1 and isinstance(inputs[0], dict):
        inputs = {inputs[0].get("name"): inputs[0].get("data")}
    if isinstance(inputs, dict) and set(inputs) == {"text_input"}:
        data = inputs["text_input"]
        if isinstance(data, np.ndarray):  # the gRPC door's tensors
            data = data.reshape(-1).tolist()
        while isinstance(data, list) and len(data) == 1:
            data = data[0]
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        return {"prompt": data}
    return inputs


def batch_rows(card: ModelCard, arrays: dict[str, Any]) -> int:
    """How many rows the job adds to a micro-batch of its model."""
    if card.batching.max_batch_size <= 0:
        return 1
    return max(1, int(next(iter(arrays.values())).shape[0]))


def fingerprint(model: str, version: str | None, inputs: Any, parameters: Any = None) -> str:
    """What makes two requests the same: the model as asked for, the inputs, and a
    generative model's parameters (absent, the hash is what it always was). (Not
    the deadline: Cancel-After gives every retry a new one.)"""
    parts = [model, version, inputs] + ([parameters] if parameters is not None else [])
    canonical = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def deadline(absolute: datetime | None, cancel_after_s: float | None) -> datetime | None:
    """The earlier of a `deadline` and `Cancel-After` seconds from now."""
    now = datetime.now(UTC)
    candidates = [absolute] if absolute else []
    if cancel_after_s:
        candidates.append(now + timedelta(seconds=cancel_after_s))
    earliest = min(candidates, default=None)
    if earliest is not None and earliest <= now:
        raise InvalidRequest(
            f"deadline {earliest.isoformat()} has already passed; send a future time",
            errors={"deadline": ["must be in the future"]},
        )
    return earliest
