"""What each process imports at start: the API server's master nothing its workers
would inherit, the Celery worker nothing of the HTTP door."""

from __future__ import annotations

import os
import subprocess
import sys

from app.platform.settings import ROOT, Settings


def _modules_after(statement: str, settings: Settings) -> set[str]:
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return set(out.stdout.split())


def test_the_api_servers_master_imports_no_onnx_runtime_and_no_metrics_client(
    settings: Settings,
) -> None:
    # ONNX Runtime's state made before a fork hangs a worker's exit (a condition
    # variable destroyed in an atexit handler); prometheus_client imported before
    # PROMETHEUS_MULTIPROC_DIR is set counts in single-process mode.
    modules = _modules_after("import app.cli.api_server", settings)
    assert "app.cli.api_server" in modules
    assert not {m for m in modules if m.split(".")[0] in ("onnxruntime", "prometheus_client")}
    assert "app.web" not in modules


def test_the_worker_entry_point_builds_no_flask_app(settings: Settings) -> None:
    modules = _modules_after("import workers.worker", settings)
    assert "workers.tasks" in modules or "app.container" in modules
    assert not {m for m in modules if m == "app.web" or m.startswith("app.web.")}


def test_the_worker_app_is_built_before_the_metrics_client_is_imported(
    settings: Settings,
) -> None:
    # workers.celery_app.worker_app sets the multi-process metrics directory (with
    # WORKER_METRICS_PORT) after these imports: prometheus_client must come later,
    # with the tasks, or it counts in single-process mode.
    modules = _modules_after("import app.container, workers.celery_app", settings)
    assert "workers.celery_app" in modules
    assert not {m for m in modules if m.split(".")[0] == "prometheus_client"}


def _guards_after(statement: str, settings: Settings, **variables: str) -> str:
    env = {**os.environ, "DATABASE_URL": settings.database_url,
           "REDIS_URL": settings.redis_url, **variables}  # fmt: skip
    code = (
        f"{statement}\nprint(container.guards == container.parts.runner.guards, container.guards)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return out.stdout.strip()


def test_the_service_keeps_every_guard_and_only_the_fault_suite_turns_some_off(
    settings: Settings,
) -> None:
    service = "from workers.worker import container"
    faults = "from tests.faults.worker import container"
    every = (
        "True Guards(claim=True, finish=True, lease=True, cap=True, republish=True, retry=True, "
        "ack=True, redelivery=True, dedupe=True, resume=True, journal=True)"
    )
    assert _guards_after(service, settings, FAULTS_GUARDS_OFF="lease", GUARDS_OFF="lease") == every
    assert _guards_after(faults, settings) == every
    assert _guards_after(faults, settings, FAULTS_GUARDS_OFF=" lease, retry") == (
        "True Guards(claim=True, finish=True, lease=False, cap=True, republish=True, retry=False, "
        "ack=True, redelivery=True, dedupe=True, resume=True, journal=True)"
    )


def test_the_stream_consumer_imports_nothing_of_the_http_door_but_its_problem_types(
    settings: Settings,
) -> None:
    """The stream door writes the HTTP door's problem objects into its entries (an error
    reads the same at both); nothing else of that door, and no Flask, is loaded."""
    modules = _modules_after("import app.streams.process", settings)
    assert "app.streams.consumer" in modules and "app.streams.publisher" in modules
    web = {m for m in modules if m == "app.web" or m.startswith("app.web.")}
    assert web == {"app.web", "app.web.problem_types"}
    assert not {m for m in modules if m.split(".")[0] in ("flask", "flask_smorest", "werkzeug")}
