"""RFC 9457 problem details: every error the API returns is shaped here.

The operations raise plain domain errors (`app.errors`), each mapped to its
problem type (its `code`), status and headers here, once; handlers at the
edge may raise `Problem` directly; Werkzeug / webargs errors are translated by
`problem_from_http_exception`. The `type` of each problem is a
relative URI under `/problems/`, which the API serves as documentation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask, Response, json, request
from werkzeug.exceptions import HTTPException

from app.errors import DeadlinePassed, DomainError, InferenceFailed
from app.operations.completions import error_object
from app.web.problem_types import PROBLEM_JSON, PROBLEM_TYPES, status_of

_STATUS_CODES = {
    400: "malformed-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "validation-error",
    503: "service-unavailable",
}


class Problem(Exception):
    """An error to send as problem+json. `extra` becomes extension members."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        known_status, self.title, _ = PROBLEM_TYPES[code]
        self.code = code
        self.status = status or known_status
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"/problems/{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "instance": request.path if request else None,
        }
        body.update(self.extra)
        if request and request.path.startswith("/v2/"):
            body["error"] = self.detail  # where KServe clients (tritonclient) read the message
        return body


def problem_response(problem: Problem) -> Response:
    status = problem.status
    if request and request.path.startswith("/v1/"):
        body, mimetype = openai_error(problem), "application/json"
        status = 400 if status == 422 else status  # (OpenAI's clients: BadRequestError)
    else:
        body, mimetype = problem.to_dict(), PROBLEM_JSON
    response = Response(json.dumps(body), status=status, mimetype=mimetype)
    for name, value in problem.headers.items():
        response.headers[name] = value
    return response


def openai_error(problem: Problem) -> dict[str, Any]:
    """The problem as OpenAI's error object, which the OpenAI-compatible door's
    clients read: the same status, the message, the field at fault (`param`)."""
    errors = problem.extra.get("errors")
    param = problem.extra.get("param")
    if param is None and isinstance(errors, dict) and errors:
        param = next(iter(errors))
    return error_object(problem.status, problem.code, problem.detail, param)


def problem_from_http_exception(exc: HTTPException) -> Problem:
    status = exc.code or 500
    code = _STATUS_CODES.get(status, "internal-error" if status >= 500 else "malformed-request")
    data: dict[str, Any] = getattr(exc, "data", None) or {}
    extra: dict[str, Any] = {}
    detail = exc.description or PROBLEM_TYPES[code][1]
    messages = data.get("messages")
    if messages:
        # webargs puts field errors under their location ("json", "query", ...).
        if isinstance(messages, dict) and len(messages) == 1:
            messages = next(iter(messages.values()))
        extra["errors"] = messages
        detail = "; ".join(flatten(messages)) or detail
    if status == 400 and "json" in str(detail).lower():
        detail = "The request body is not valid JSON: " + str(detail)
    if status == 413:
        limit = request.max_content_length
        setting = (
            "MAX_UPLOAD_BYTES" if request.path.startswith("/files")
            else "MAX_MODEL_BYTES" if request.path.startswith("/v2/repository")
            else "MAX_REQUEST_BYTES"
        )  # fmt: skip
        detail = f"The request body is larger than the limit of {limit} bytes ({setting})."
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return Problem(code, str(detail), status=status, headers=headers, **extra)


def flatten(messages: Any, path: str = "") -> list[str]:
    """Field errors as 'field.sub: message' lines, for the human-readable detail."""
    if isinstance(messages, dict):
        return [
            line
            for key, value in messages.items()
            for line in flatten(value, f"{path}.{key}" if path else str(key))
        ]
    if isinstance(messages, list):
        return [line for value in messages for line in flatten(value, path)]
    return [f"{path}: {messages}" if path else str(messages)]


def problem_from_domain_error(exc: DomainError) -> Problem:
    """The one mapping of the operations' errors to HTTP: the problem type is the
    error's code, its status the one `status_of` gives (shared with the stream
    door's problem objects); some errors point elsewhere (`Location`)."""
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    job_id = exc.extra.get("job_id")
    # (not for a lane call withdrawn unrun: it will have no record)
    if isinstance(exc, InferenceFailed | DeadlinePassed) and job_id and exc.extra.get("taken", 1):
        headers["Location"] = f"/jobs/{job_id}"
    return Problem(exc.code, exc.detail, status=status_of(exc), headers=headers, **exc.extra)


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(Problem, problem_response)
    app.register_error_handler(
        DomainError, lambda exc: problem_response(problem_from_domain_error(exc))
    )

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return problem_response(problem_from_http_exception(exc))
        for applies, said, detail, retry_after in _unavailable_kinds():
            if applies(exc):
                app.logger.warning("%s: %s", said, exc)
                headers = {"Retry-After": retry_after}
                return problem_response(Problem("service-unavailable", detail, headers=headers))
        if _nul_in_text(exc):
            return problem_response(
                Problem(
                    "malformed-request",
                    "a text field or header contains a NUL character (\\u0000), which no "
                    "name, filter or key may hold; remove it",
                    status=400,
                )
            )
        app.logger.exception("unhandled error")
        return problem_response(Problem("internal-error", "An unexpected error occurred."))


def _unavailable_kinds() -> list[tuple[Callable[[BaseException], bool], str, str, str]]:
    """A part the service needs not answering: (which errors, what the log says, the
    503's detail, Retry-After). Imported late: the doors load the platform lazily."""
    from app.platform.broker import broker_unavailable
    from app.platform.database import database_disk_full, database_unavailable

    return [
        (database_disk_full, "database disk full", "The database's disk is full, so nothing "
         "of this request was kept; retry later, once an operator has freed space.", "30"),
        (database_unavailable, "database unavailable", "The database did not answer.", "5"),
        (broker_unavailable, "Redis unavailable", "Redis (the broker) did not answer, so "
         "nothing of this request was kept; retry shortly.", "2"),
    ]  # fmt: skip


def _nul_in_text(exc: BaseException | None) -> bool:
    """psycopg2 refuses text holding NUL when it binds a parameter; any string a
    client sends (a model filter, a key, a file name) can carry one."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, ValueError) and "NUL (0x00)" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
