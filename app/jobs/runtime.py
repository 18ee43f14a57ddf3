"""The process's execute-path runtime (model repository + ORT sessions), built once."""

from __future__ import annotations

from flask import current_app

from app.jobs.runner import Runtime
from app.runtime.sessions import SessionPool


def current_runtime() -> Runtime:
    runtime: Runtime | None = current_app.extensions.get("runtime")
    if runtime is None:
        settings = current_app.extensions["settings"]
        runtime = Runtime(
            repository=current_app.extensions["models"],
            sessions=SessionPool(settings.ort_provider, settings.ort_intra_op_threads),
            settings=settings,
            new_session=current_app.extensions["database"].sessionmaker,
        )
        current_app.extensions["runtime"] = runtime
    return runtime
