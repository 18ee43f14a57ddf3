"""What each process imports at start: the API server's master nothing its workers
would inherit, the Celery worker nothing of the HTTP door."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

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
        "ack=True, redelivery=True, dedupe=True, resume=True, journal=True, steps=True)"
    )
    assert _guards_after(service, settings, FAULTS_GUARDS_OFF="lease", GUARDS_OFF="lease") == every
    assert _guards_after(faults, settings) == every
    assert _guards_after(faults, settings, FAULTS_GUARDS_OFF=" lease, retry") == (
        "True Guards(claim=True, finish=True, lease=False, cap=True, republish=True, retry=False, "
        "ack=True, redelivery=True, dedupe=True, resume=True, journal=True, steps=True)"
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


# What the image's runtime stage leaves out (requirements-build.txt, the benchmark's
# packages, the repository's own modelbuild/, bench/ and tests/): a finder ahead of
# every other refuses them, as a missing package would.
_BLOCKED = (
    "sklearn", "skl2onnx", "onnx", "gguf", "safetensors", "scipy", "joblib", "threadpoolctl",
    "narwhals", "ml_dtypes", "gunicorn", "matplotlib", "modelbuild", "bench", "tests",
)  # fmt: skip
_WITHOUT_BUILDERS = f"""
import importlib, importlib.abc, pkgutil, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {_BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
import app, workers
for package in (app, workers):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not module.name.endswith(".__main__"):  # runs a server when imported
            importlib.import_module(module.name)
from app.cli.main import cli
cli.main(sys.argv[1:], prog_name="manage.py")
"""


def _without_builders(settings: Settings, *args: str, **variables: str) -> CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": settings.database_url,
           "REDIS_URL": settings.redis_url, **variables}  # fmt: skip
    return subprocess.run([sys.executable, "-c", _WITHOUT_BUILDERS, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_every_module_imports_without_the_model_builders_or_the_benchmark(
    settings: Settings,
) -> None:
    """The runtime image carries neither: each module of app/ and workers/ imports
    (the builders import theirs inside), and the CLI answers."""
    done = _without_builders(settings, "--help")
    assert done.returncode == 0, done.stderr
    assert "models" in done.stdout and "submit" in done.stdout


def test_models_build_without_the_builders_says_what_to_install(
    settings: Settings, tmp_path: Path
) -> None:
    done = _without_builders(settings, "models", "build", "--force",
                             MODEL_REPOSITORY=str(tmp_path))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "pip install -r requirements-build.txt" in done.stderr
    assert not list(tmp_path.rglob("*.onnx"))
