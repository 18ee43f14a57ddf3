"""What a request handler reaches: the process's container (its operations, its
settings), this API process's count of each tenant's requests in progress, and
the request's database scope (the request is one: its session closes at
teardown). The only module of the HTTP door that reads `current_app`."""

from __future__ import annotations

import sys

from flask import Flask, current_app

from app.container import Container
from app.errors import TooManyRequests
from app.operations.holds import Holds, Wording
from app.platform.settings import Settings

IN_PROGRESS = "requests_in_progress"


def container_of(app: Flask) -> Container:
    container: Container = app.extensions["container"]
    return container


def services() -> Container:
    return container_of(current_app)


def requests_in_progress() -> Holds:
    """Each tenant's requests in progress on this API process (`in_progress_of`)."""
    holds: Holds = current_app.extensions[IN_PROGRESS]
    return holds


def in_progress_of(settings: Settings) -> Holds:
    """Each tenant's requests whose bodies are awaited on an API process, bounded by
    MAX_REQUESTS_PER_TENANT (0: unbounded)."""
    wording = Wording(
        what="requests", per_tenant="MAX_REQUESTS_PER_TENANT", total="",
        advice="let one finish", refusal=TooManyRequests,
    )  # fmt: skip
    per_tenant = settings.max_requests_per_tenant or sys.maxsize
    return Holds(per_tenant, sys.maxsize, wording)
