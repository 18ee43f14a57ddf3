"""RFC 9457 problem types: each domain error's code, HTTP status and title, as data.

The HTTP door's problem+json is made from them (`app.web.problems`, which adds
headers and its own HTTP-only types); the stream door writes the same problem
objects into its output and dead-letter entries (`app.streams.codec`), so an
error reads the same at both. Served as documentation at /problems/<code>.
Flask-free, like the package it is in, so the stream door loads no Flask.
"""

from __future__ import annotations

from typing import Any

from app.errors import DomainError, InferenceFailed, TenantGone

PROBLEM_JSON = "application/problem+json"

# code -> (status, title, what a client should do). Served at /problems/<code>.
PROBLEM_TYPES: dict[str, tuple[int, str, str]] = {
    "malformed-request": (
        400,
        "Malformed request",
        "The body could not be parsed as JSON. Send a JSON object with "
        "Content-Type: application/json.",
    ),
    "unauthorized": (
        401,
        "Missing or invalid API key",
        "Send `Authorization: Bearer <api key>`. Create a key with "
        "`python manage.py create-api-key --tenant NAME`.",
    ),
    "forbidden": (
        403,
        "Forbidden for this key",
        "The key is valid but not for this route: the model repository routes need an "
        "operator key (`python manage.py create-api-key --operator`); job and inference "
        "routes need a tenant key.",
    ),
    "invalid-parameter": (
        400,
        "A parameter cannot be honoured",
        "A parameter of the request (`parameter` names it) has a value of the wrong type, "
        "is not taken by this route, or asks for what the service cannot do: a model "
        "repository load's `config` field that a card.json cannot express, or Triton's "
        "`file:` parameters (PUT the file instead). `detail` says which and what is taken.",
    ),
    "not-found": (404, "Not found", "Check the id or name in the URL."),
    "unknown-model": (
        404,
        "Unknown model",
        "GET /models lists the models and versions this service serves.",
    ),
    "method-not-allowed": (405, "Method not allowed", "See /docs for the methods of this URL."),
    "conflict": (
        409,
        "Conflict with the current state",
        "The resource is not in a state that allows this (for example, the job has "
        "already finished, or the dead letter was already replayed); GET it to see why.",
    ),
    "payload-too-large": (
        413,
        "Request body too large",
        "Send a smaller body; the limit is set by MAX_REQUEST_BYTES.",
    ),
    "unsupported-media-type": (
        415,
        "Unsupported media type",
        "Send the body as JSON with Content-Type: application/json.",
    ),
    "validation-error": (
        422,
        "Request does not match the schema",
        "The `errors` member names each field that was wrong and why; see /docs.",
    ),
    "invalid-input": (
        422,
        "Inputs do not match the model",
        "The `errors` member names each input that was wrong, with the expected name, "
        "shape and datatype; GET /v2/models/<name> gives the model's inputs.",
    ),
    "invalid-model": (
        422,
        "Model cannot serve",
        "The model file is not an ONNX model ONNX Runtime can load, uses datatypes the "
        "service does not support, or does not match its card.json; `detail` says which.",
    ),
    "inference-failed": (
        500,
        "Inference failed",
        "The model did not produce outputs for this request. `error_code` says why: "
        "invalid_input, inference_error, non_finite_output, code_error (the model's own "
        "code raised) or code_time_limit (422) come from the inputs; "
        "cancelled or deadline_exceeded (409) from the job's own limits; anything else "
        "(500) from the service. `job_id`, where present, names the job.",
    ),
    "sync-timeout": (
        504,
        "Not finished in time",
        "The call was not answered within its timeout (SYNC_TIMEOUT_SECONDS, or the "
        "request's `timeout` parameter). A job goes on: GET the Location URL "
        "(/jobs/<job_id>, with ?wait=30 to wait) for its result. A sync lane call says "
        "`taken`: false, no worker took it and it never runs; true, its record (once it "
        "ran) is at the Location URL.",
    ),
    "too-many-waits": (
        429,
        "Too many waiting requests",
        "Event streams, long-polls, `Prefer: wait` and sync calls hold a server thread each; a "
        "tenant may hold MAX_WAITS_PER_TENANT of them per API process, everyone together "
        "MAX_WAITS. Close one, or poll without waiting; retry after Retry-After seconds.",
    ),
    "too-many-requests": (
        429,
        "Too many requests in progress",
        "A request holds one of an API process's threads while its body arrives (an upload, "
        "until it ends); a tenant may have MAX_REQUESTS_PER_TENANT of them per API process, "
        "so one tenant's slow clients leave threads for everyone else. Retry after "
        "Retry-After seconds.",
    ),
    "queue-full": (
        429,
        "Too many jobs queued for this model",
        "The model's queue is at its bound (MAX_QUEUED_PER_MODEL), or its sync lane holds "
        "SYNC_LANE_MAX_WAITING calls waiting for a worker. Nothing of this request was kept: "
        "send it again after Retry-After seconds.",
    ),
    "quota-exceeded": (
        429,
        "A quota of this tenant is used up",
        "The tenant is at one of its quotas (`limit` names it, `allowed` and `used` say "
        "where it stands; an operator sets them with `manage.py tenants set`). Nothing of "
        "this request was kept: send it again after Retry-After seconds.",
    ),
    "insufficient-storage": (
        507,
        "The file store is full",
        "The file store has no room for this upload (its disk is full); nothing of it was "
        "kept. Send it again after Retry-After seconds, once space has been freed.",
    ),
    "service-unavailable": (
        503,
        "Service unavailable",
        "A dependency (database, broker or file store) did not answer, the database's disk "
        "is full, or the worker running a sync call of a model that is not idempotent "
        "stopped before answering it (`detail` says which); retry after Retry-After seconds.",
    ),
    "internal-error": (500, "Internal server error", "Retry later; the error was logged."),
}

# Statuses that differ from the problem type's own.
_FORBIDDEN_STATUS = 403  # a tenant deleted while its key was cached (TenantGone)
_FAULT_STATUS = {"input": 422, "limits": 409, "service": 500}  # an InferenceFailed's


def status_of(exc: DomainError) -> int:
    """The status of `exc`'s problem: its type's, except where the error picks one."""
    if isinstance(exc, TenantGone):
        return _FORBIDDEN_STATUS
    if isinstance(exc, InferenceFailed):
        return _FAULT_STATUS[exc.fault]
    return PROBLEM_TYPES[exc.code][0]


def problem(exc: DomainError, instance: str | None = None) -> dict[str, Any]:
    """`exc` as an RFC 9457 problem object (`type`, `title`, `status`, `detail`,
    `instance`, and its extension members: `errors`, `expected`, `job_id`, ...),
    for a door that writes problems into its own messages rather than HTTP bodies."""
    body: dict[str, Any] = {
        "type": f"/problems/{exc.code}",
        "title": PROBLEM_TYPES[exc.code][1],
        "status": status_of(exc),
        "detail": exc.detail,
        "instance": instance,
    }
    body.update(exc.extra)
    if exc.retry_after is not None:
        body["retry_after"] = exc.retry_after
    return body
