"""Flower, as `make run` starts it: behind its login, and never showing a job's
inputs. Tasks take ids and model names only (the job row in PostgreSQL holds
the inputs), which the first test checks on every registered task's signature
and the second on what a real Flower shows of a real worker's tasks."""

from __future__ import annotations

import ast
import inspect
import json
import secrets
import subprocess
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask

from app import create_app
from app.cli.launcher import flower_command
from app.platform.settings import ROOT, Settings
from app.web.context import container_of
from tests.conftest import (
    TenantAuth,
    WorkerProcess,
    service_env,
    stop_process,
    wait_for_job,
)
from tests.support import free_port, process_started, starts_processes, wait_until

# What a task may take: a model's name, or the id of a row that holds the rest; a
# sweep, the control lease's term it was sent in (app.platform.fencing).
ARGUMENTS: dict[str, object] = {
    "model": str, "batch_id": str, "delivery_id": int, "fence": int | None,
}  # fmt: skip
PIXEL = 13.371337  # a value no id, name or count contains
TEXT = "flower must never show this sentence"


def test_every_task_takes_ids_or_model_names_only(app: Flask) -> None:
    import workers.tasks  # noqa: F401  (registers the tasks)

    tasks = {
        n: t for n, t in container_of(app).parts.celery.tasks.items() if not n.startswith("celery.")
    }
    assert len(tasks) >= 6
    for name, task in tasks.items():
        hints = typing.get_type_hints(task.run)
        for parameter in inspect.signature(task.run).parameters:
            assert ARGUMENTS.get(parameter) == hints.get(parameter), (
                f"task {name} takes {parameter}: {hints.get(parameter)}; tasks take ids and "
                "model names, the job's row holds its inputs"
            )


class FlowerProcess:
    def __init__(self, settings: Settings, log_path: Path, login: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log_path.open("wb")
        # As the launcher starts it, except that it asks no worker (of other test runs
        # on this broker) to switch its events on: the test's worker sends its own.
        args = flower_command("127.0.0.1", self.port, "--enable_events=False")
        env = service_env(settings, FLOWER_BASIC_AUTH=login)
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        process_started()

        def answers() -> bool:
            assert self.proc.poll() is None, log_path.read_text()[-3000:]
            try:
                requests.get(self.base, timeout=2)
            except requests.ConnectionError:
                return False
            return True

        wait_until(answers, "Flower to start", 60, interval=0.2)

    def stop(self) -> None:
        stop_process(self.proc, 20)
        self.log.close()


@pytest.fixture
def own(settings: Settings) -> Settings:
    """A queue of its own, so the drains Flower sees are this test's."""
    return settings.with_overrides(jobs_queue=f"flower-{uuid.uuid4().hex[:8]}")


@pytest.fixture
@starts_processes
def flower(own: Settings, tmp_path: Path) -> Iterator[tuple[FlowerProcess, tuple[str, str]]]:
    user, password = "admin", secrets.token_urlsafe(12)
    process = FlowerProcess(own, tmp_path / "flower.log", f"{user}:{password}")
    yield process, (user, password)
    process.stop()


def test_flower_needs_its_login_and_shows_ids_and_model_names_never_inputs(
    own: Settings,
    flower: tuple[FlowerProcess, tuple[str, str]],
    tenant: TenantAuth,
    tmp_path: Path,
) -> None:
    process, login = flower
    for path in ("/", "/api/tasks", "/api/workers"):
        assert requests.get(process.base + path, timeout=10).status_code == 401
        wrong = requests.get(process.base + path, auth=(login[0], "wrong"), timeout=10)
        assert wrong.status_code == 401

    worker = WorkerProcess(own, tmp_path / "worker.log", concurrency=1, options=("--task-events",))
    app = create_app(own)
    try:
        client = app.test_client()
        bodies = [
            {"model": "digits", "inputs": {"pixels": [[PIXEL] * 64]}},
            {"model": "minilm", "inputs": {"text": [TEXT]}},
        ]
        for body in bodies:
            response = client.post("/jobs", json=body, headers=tenant.headers)
            assert response.status_code == 202, response.json
            assert wait_for_job(client, tenant.headers, response.json["id"], 60)["status"] == (
                "succeeded"
            )
        tasks = _tasks_seen(process, login, {"digits", "minilm"})
    finally:
        worker.stop()
        container_of(app).parts.database.engine.dispose()

    shown = json.dumps(tasks)
    for task_id in tasks:
        shown += requests.get(f"{process.base}/api/task/info/{task_id}", auth=login,
                              timeout=10).text  # fmt: skip
    assert str(PIXEL) not in shown and TEXT not in shown
    assert "pixels" not in shown and "flower must" not in shown
    for task in tasks.values():
        arguments = ast.literal_eval(task["args"])
        assert isinstance(arguments, tuple | list) and all(
            isinstance(a, int) or _name_or_id(a) for a in arguments
        ), task
        assert ast.literal_eval(task["kwargs"]) == {}, task


def _tasks_seen(
    process: FlowerProcess, login: tuple[str, str], models: set[str]
) -> dict[str, dict[str, Any]]:
    """Flower's tasks once it has seen a drain of each model succeed."""
    seen: dict[str, Any] = {"drained": set(), "tasks": {}}

    def drained_each() -> dict[str, dict[str, Any]] | None:
        tasks: dict[str, dict[str, Any]] = requests.get(
            f"{process.base}/api/tasks", auth=login, timeout=10
        ).json()
        drained = {
            ast.literal_eval(t["args"])[0]
            for t in tasks.values()
            if t["name"] == "jobs.drain" and t["state"] == "SUCCESS"
        }
        seen.update(drained=drained, tasks=tasks)
        return tasks if models <= drained else None

    def saw() -> str:
        return (
            f"a drain of each of {models}; Flower saw drains of {seen['drained']}: {seen['tasks']}"
        )

    return wait_until(drained_each, saw, 60, interval=0.5)


def _name_or_id(value: object) -> bool:
    if not isinstance(value, str) or len(value) > 100:
        return False
    try:
        uuid.UUID(value)
        return True
    except ValueError:
        return value.replace("-", "").replace("_", "").replace(".", "").isalnum()
