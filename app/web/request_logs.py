"""The HTTP door's log lines: per request a log scope with its request id (echoed
in X-Request-ID) and, in JSON mode, one `request` line (see app.observability.logs)."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from flask import Flask, g, request

from app.observability import logs

# X-Request-ID: what a proxy or client sent, if it is a sane token; else our own.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
_JOB_LOCATION = re.compile(r"/jobs/([0-9a-f-]{36})")
requests_logger = logging.getLogger("app.requests")
_ROUTINE = frozenset({"/metrics", "/v2/health/live", "/v2/health/ready"})


def request_id(header: str | None) -> str:
    """The client's request id when it is 1-128 characters of a token's alphabet
    (no spaces, quotes or control characters to forge log lines with), else a new one."""
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def install(app: Flask, fmt: str) -> None:
    """Per request: a log scope with its request id (echoed in X-Request-ID), and in
    JSON mode one `request` line with method, path, status, duration, tenant and job."""

    @app.before_request
    def _open() -> None:
        rid = request_id(request.headers.get("X-Request-ID"))
        job_id = (request.view_args or {}).get("job_id")
        fields = {"request_id": rid, **({"job_id": str(job_id)} if job_id else {})}
        g.log_token = logs.enter(**fields)
        g.request_id, g.request_started = rid, time.monotonic()

    @app.after_request
    def _close(response: Any) -> Any:
        rid = g.get("request_id")
        if rid is None:
            return response
        response.headers["X-Request-ID"] = rid
        if fmt == "json":
            tenant = g.get("tenant")
            found = _JOB_LOCATION.search(response.headers.get("Location", ""))
            # Probes and scrapes come every few seconds: DEBUG unless they fail.
            routine = request.path in _ROUTINE and response.status_code < 400
            requests_logger.log(
                logging.DEBUG if routine else logging.INFO,
                "%s %s %s", request.method, request.path, response.status_code,
                extra={"method": request.method, "path": request.path,
                       "status": response.status_code,
                       "duration_ms": round((time.monotonic() - g.request_started) * 1000, 2),
                       "tenant": tenant.name if tenant is not None else None,
                       **({"job_id": found.group(1)} if found else {})},
            )  # fmt: skip
        return response

    @app.teardown_request
    def _teardown(_exc: BaseException | None) -> None:
        token = g.pop("log_token", None)
        if token is not None:
            logs.leave(token)
