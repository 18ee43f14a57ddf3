"""The stream door's protocol: input entries in, output and dead-letter entries out.

An input entry has the fields `id` (the caller's request id), `inputs` (JSON,
as a job's inputs: `{"<input>": nested list}` or KServe v2 tensors, or a
generative model's `{"messages": [...]}` / `{"prompt": "..."}`), and
optionally `parameters` (JSON: a generative model's sampling parameters),
`priority` (0-9), and `model` / `version` where one entry goes to another model
than its binding's. An output entry has `id`, `job_id`, `status`
and `outputs` (JSON) or `error` (a JSON problem object, RFC 9457, as the HTTP
door's); a dead-letter entry has the input entry's own fields and `error`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.errors import DomainError, InvalidRequest, MalformedRequest, TooLarge
from app.observability import tracing
from app.operations import EntryRequest
from app.operations.bindings import Finished
from app.operations.calls import ended_without_outputs
from app.platform.logstreams import LogEntry
from app.statuses import JobStatus
from app.web.problem_types import problem

MAX_REQUEST_ID = 200
REQUIRED = ("id", "inputs")


def decode(entry: LogEntry, max_bytes: int) -> EntryRequest | DomainError:
    """The entry as a request, or the error that makes it a dead letter (never
    raised: a poison entry must not stop the entries behind it)."""
    try:
        return _decode(entry, max_bytes)
    except DomainError as exc:
        return exc
    except Exception as exc:  # anything the checks below missed is the entry's fault too
        return MalformedRequest(
            f"entry {entry.id} cannot be read ({type(exc).__name__}); see the entry format "
            "in the README's stream door section",
            errors={"entry": ["a readable input entry"]},
        )


def _decode(entry: LogEntry, max_bytes: int) -> EntryRequest:
    fields = entry.fields
    missing = [name for name in REQUIRED if name not in fields]
    if missing:
        raise InvalidRequest(
            f"entry {entry.id} has no {' and no '.join(missing)} field; an input entry has "
            "`id` (your request id) and `inputs` (JSON), and may have `priority` (0-9)",
            errors={name: ["Missing data for required field."] for name in missing},
        )
    request_id = _text(fields, "id")
    if not 0 < len(request_id) <= MAX_REQUEST_ID:
        raise InvalidRequest(
            f"entry {entry.id}: id must be 1 to {MAX_REQUEST_ID} characters",
            errors={"id": [f"1 to {MAX_REQUEST_ID} characters"]},
        )
    raw = fields["inputs"]
    if len(raw) > max_bytes:
        raise TooLarge(
            f"entry {entry.id}: inputs are {len(raw)} bytes, above the limit of {max_bytes} "
            "(MAX_REQUEST_BYTES)",
            limit=max_bytes,
        )
    inputs = _json_field(entry, "inputs", raw, '{"pixels": [[...]]}')
    return EntryRequest(
        entry.id, request_id, inputs, _priority(entry, fields),
        _optional(fields, "model"), _optional(fields, "version"), _parameters(entry, fields),
        tracing.valid(_optional(fields, tracing.TRACEPARENT)),
    )  # fmt: skip


def _parameters(entry: LogEntry, fields: Mapping[str, bytes]) -> Any:
    """A generative model's sampling parameters (JSON), as a job's `parameters`."""
    if "parameters" not in fields:
        return None
    raw = _text(fields, "parameters")
    return _json_field(entry, "parameters", raw, '{"max_tokens": 64, "temperature": 0}')


def _json_field(entry: LogEntry, name: str, raw: str | bytes, example: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedRequest(
            f"entry {entry.id}: {name} is not JSON ({_reason(exc)}); send a JSON object such "
            f"as {example}",
            errors={name: ["not JSON"]},
        ) from None


def _text(fields: Mapping[str, bytes], name: str) -> str:
    try:
        text = fields[name].decode()
    except UnicodeDecodeError:
        raise MalformedRequest(f"{name} is not UTF-8 text", errors={name: ["UTF-8 text"]}) from None
    if "\x00" in text:  # PostgreSQL's text cannot hold it: refused here, not by the database
        raise MalformedRequest(
            f"{name} contains a NUL character (\\u0000), which no id or name may hold",
            errors={name: ["text without NUL characters"]},
        )
    return text


def _optional(fields: Mapping[str, bytes], name: str) -> str | None:
    return _text(fields, name) or None if name in fields else None


def _priority(entry: LogEntry, fields: Mapping[str, bytes]) -> int:
    if "priority" not in fields:
        return 0
    text = _text(fields, "priority")
    if not (text.isascii() and text.isdigit() and 0 <= int(text) <= 9):
        raise InvalidRequest(
            f"entry {entry.id}: priority {text!r} is not 0 to 9",
            errors={"priority": ["an integer from 0 to 9"]},
        )
    return int(text)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(":")[0] if isinstance(exc, UnicodeDecodeError) else str(exc)


def dead_letter(entry: LogEntry, error: DomainError, log: str) -> dict[str, bytes]:
    """The entry's own fields (as they were written) and `error`, a problem object."""
    fields = dict(entry.fields)
    fields["error"] = _json(problem(error, f"{log}/{entry.id}"))
    return fields


def result(item: Finished) -> dict[str, bytes]:
    """The output entry of a finished job: `outputs` when it succeeded, else
    `error` (the problem a sync call of the same job would answer)."""
    fields = {"id": item.request_id.encode(), "job_id": str(item.job_id).encode(),
              "status": item.status.encode()}  # fmt: skip
    if item.status == JobStatus.SUCCEEDED:
        fields["outputs"] = _json(item.outputs)
    else:
        error = ended_without_outputs(item.job_id, item.status, item.error_code,
                                      item.error_message)  # fmt: skip
        fields["error"] = _json(problem(error, f"/jobs/{item.job_id}"))
    return fields


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
