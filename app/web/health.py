"""KServe v2 health and server metadata, and the problem-type documentation."""

from __future__ import annotations

from typing import Any

from app.operations.triton import EXTENSIONS
from app.web.blueprint import Blueprint
from app.web.context import services
from app.web.problems import PROBLEM_TYPES, Problem

blp = Blueprint("health", __name__, description="Health and server metadata")

SERVER_NAME = "inference-jobs"
SERVER_VERSION = "0.1.0"


@blp.get("/v2")
@blp.response(200, description="KServe v2 server metadata, naming Triton's extensions served")
def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}


@blp.get("/v2/health/live")
@blp.response(200, description="The API process is up")
def live() -> dict[str, Any]:
    return {"live": True}


@blp.get("/v2/health/ready")
@blp.response(200, description="PostgreSQL and Redis answer and a model is loadable")
@blp.alt_response(503, response="SERVICE_UNAVAILABLE", description="Names each failed check")
def ready() -> dict[str, Any]:
    checks = services().status.readiness()
    failed = {name: message for name, message in checks.items() if message != "ok"}
    if failed:
        raise Problem(
            "service-unavailable",
            "not ready: " + "; ".join(f"{k}: {v}" for k, v in failed.items()),
            headers={"Retry-After": "5"},
            checks=checks,
        )
    return {"ready": True, "checks": checks}


@blp.get("/problems/<code>")
@blp.response(200, description="What a problem type means and what to do about it")
def problem_type(code: str) -> dict[str, Any]:
    if code not in PROBLEM_TYPES:
        raise Problem("not-found", f"no problem type '{code}'; known: {', '.join(PROBLEM_TYPES)}")
    status, title, advice = PROBLEM_TYPES[code]
    return {"type": f"/problems/{code}", "status": status, "title": title, "description": advice}
