"""Scale-out on real processes: two `manage.py worker` processes, each its own
Celery node name and queue (`gpu` and `cpu`; both run ONNX Runtime on the CPU
here), against one Redis and one PostgreSQL, and two models routed to them.

Which node ran a job: Celery's task events (the workers run with
`--task-events`, as in docker-compose.yml) name the node, the model (a drain's
argument) and how many jobs the drain ran; a drain claims only its model's
jobs, so the counts per node and model say where every job ran.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from flask import Flask

from app import create_app
from app.execution import dispatch
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.web.context import container_of
from tests.conftest import QUIET_WORKER, RUN_ID, TenantAuth, service_env, stop_process
from tests.support import process_started, starts_processes, wait_until

GPU, CPU = f"gpu-{RUN_ID}", f"cpu-{RUN_ID}"
ON_GPU, ON_CPU = "on-gpu", "on-cpu"
JOBS = 60
TERMINAL = ("succeeded", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def routed_settings(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A model repository of this module: the digits model as `on-gpu` (card queue
    `gpu-...`) and as `on-cpu` (`cpu-...`), beside the bundled digits."""
    root = tmp_path_factory.mktemp("scaleout-models")
    shutil.copytree(settings.model_repository / "digits", root / "digits")
    for name, queue in ((ON_GPU, GPU), (ON_CPU, CPU)):
        shutil.copytree(settings.model_repository / "digits", root / name)
        card = root / name / "1" / "card.json"
        card.write_text(json.dumps({**json.loads(card.read_text()), "queue": queue}))
    return settings.with_overrides(model_repository=root)


@pytest.fixture(scope="module")
def routed_app(routed_settings: Settings) -> Flask:
    return create_app(routed_settings)


class TaskEvents:
    """Celery events from every worker, captured in a thread from before the workers
    start (events are broadcast: one sent while nobody listens is gone)."""

    def __init__(self, celery: Celery) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._connection = celery.connection_for_read()
        self._receiver = celery.events.Receiver(self._connection, handlers={"*": self._on})
        self._thread = threading.Thread(target=self._capture, daemon=True)
        self._thread.start()

    def _capture(self) -> None:
        self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def _on(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def nodes(self) -> set[str]:
        with self._lock:
            return {e["hostname"] for e in self.events}

    def drained(self) -> dict[tuple[str, str], int]:
        """Jobs run per (node, model), from the drains that ended."""
        with self._lock:
            events = list(self.events)
        models = {
            e["uuid"]: ast.literal_eval(e["args"])[0]
            for e in events
            if e["type"] == "task-received" and e["name"] == dispatch.DRAIN_TASK
        }
        done: dict[tuple[str, str], int] = {}
        for e in events:
            if e["type"] == "task-succeeded" and e["uuid"] in models:
                key = (e["hostname"].split("@")[0], models[e["uuid"]])
                done[key] = done.get(key, 0) + int(e["result"])
        return done

    def received(self) -> set[tuple[str, str]]:
        """(node, model) of every drain a node took, finished or not."""
        with self._lock:
            return {
                (e["hostname"].split("@")[0], ast.literal_eval(e["args"])[0])
                for e in self.events
                if e["type"] == "task-received" and e["name"] == dispatch.DRAIN_TASK
            }

    def passed_on(self) -> set[tuple[str, str]]:
        """(node, model) of drains a node sent on to another queue (a retry)."""
        with self._lock:
            events = list(self.events)
        models = {e["uuid"]: ast.literal_eval(e["args"])[0] for e in events
                  if e["type"] == "task-received" and e["name"] == dispatch.DRAIN_TASK}  # fmt: skip
        return {
            (e["hostname"].split("@")[0], models[e["uuid"]])
            for e in events
            if e["type"] == "task-retried" and e["uuid"] in models
        }

    def stop(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(10)
        self._connection.release()


@pytest.fixture(scope="module")
def task_events(routed_app: Flask) -> Iterator[TaskEvents]:
    events = TaskEvents(container_of(routed_app).parts.celery)
    yield events
    events.stop()


class Worker:
    """`python manage.py worker` on WORKER_QUEUES=`queue`, as compose runs it."""

    def __init__(self, settings: Settings, folder: Path, node: str, queue: str) -> None:
        self.node = node
        self.log_path = folder / f"{node}.log"
        self.log = self.log_path.open("wb")
        args = [sys.executable, "manage.py", "worker", "--hostname", f"{node}@%h",
                "--task-events", *QUIET_WORKER]  # fmt: skip
        env = service_env(settings, WORKER_QUEUES=queue, WORKER_CONCURRENCY="2",
                          DRAIN_LINGER_MS="0", ORT_PROVIDER="cpu")  # fmt: skip
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        process_started()

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{node} did not start:\n{self.text()[-3000:]}")
            return b" ready." in self.log_path.read_bytes()

        wait_until(ready, lambda: f"{node} ready:\n{self.text()[-3000:]}", 90, interval=0.1)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def start_worker(
    settings: Settings, folder: Path, kind: str, queue: str, events: TaskEvents
) -> Worker:
    """A worker with a node name of its own, once its events reach the receiver."""
    node = f"{kind}-{RUN_ID}-{uuid.uuid4().hex[:4]}"
    worker = Worker(settings, folder, node, queue)
    wait_until(lambda: any(n.startswith(f"{node}@") for n in events.nodes()),
               f"an event from {node} at the receiver", 30, interval=0.2)  # fmt: skip
    return worker


@pytest.fixture(scope="module")
@starts_processes
def cpu_worker(
    routed_settings: Settings, tmp_path_factory: pytest.TempPathFactory, task_events: TaskEvents
) -> Iterator[Worker]:
    worker = start_worker(routed_settings, tmp_path_factory.mktemp("cpu"), "cpu", CPU, task_events)
    yield worker
    worker.stop()


@pytest.fixture
def gpu_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu")


def submit(app: Flask, auth: dict[str, str], model: str, count: int) -> list[uuid.UUID]:
    client = app.test_client()
    ids = []
    for i in range(count):
        body = {"model": model, "inputs": {"pixels": [[float(i % 17)] * 64]}}
        response = client.post("/jobs", json=body, headers=auth)
        assert response.status_code == 202, response.json
        ids.append(uuid.UUID(response.json["id"]))  # type: ignore[index]
    return ids


def rows(database: Database, ids: list[uuid.UUID]) -> list[Any]:
    with database.engine.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT id, status, attempts FROM jobs WHERE id = ANY(:ids)"),
                {"ids": ids},
            )
        )


def wait_finished(database: Database, ids: list[uuid.UUID], timeout: float = 180) -> None:
    wait_until(lambda: all(r.status in TERMINAL for r in rows(database, ids)),
               "every job finished", timeout, interval=0.2)  # fmt: skip


def wait_drained(events: TaskEvents, node: str, model: str, jobs: int) -> None:
    """Until the drain events say `node` ran `jobs` of `model` (they trail the jobs'
    rows by a moment: a drain's event is sent when it returns)."""
    wait_until(lambda: events.drained().get((node, model), 0) >= jobs,
               lambda: f"{jobs} drains of {model} on {node}: {events.drained()}", 30,
               interval=0.2)  # fmt: skip


def assert_ran_once(database: Database, ids: list[uuid.UUID]) -> None:
    """Each job succeeded on its first attempt and reached a terminal state once."""
    assert {(r.status, r.attempts) for r in rows(database, ids)} == {("succeeded", 1)}
    with database.engine.connect() as conn:
        terminal: dict[uuid.UUID, int] = dict(
            conn.execute(
                sa.text(
                    "SELECT job_id, count(*) FROM job_events "
                    "WHERE job_id = ANY(:ids) AND status = ANY(:terminal) GROUP BY job_id"
                ),
                {"ids": ids, "terminal": list(TERMINAL)},
            ).all()
        )
    assert terminal == dict.fromkeys(ids, 1)


def test_each_model_runs_only_on_the_worker_of_its_queue(
    routed_app: Flask,
    routed_settings: Settings,
    database: Database,
    tenant: TenantAuth,
    task_events: TaskEvents,
    cpu_worker: Worker,
    gpu_folder: Path,
) -> None:
    gpu_worker = start_worker(routed_settings, gpu_folder, "gpu", GPU, task_events)
    try:
        on_gpu, on_cpu = [], []
        for _ in range(JOBS // 10):  # interleaved, so both workers are busy at once
            on_gpu += submit(routed_app, tenant.headers, ON_GPU, 10)
            on_cpu += submit(routed_app, tenant.headers, ON_CPU, 10)
        wait_finished(database, on_gpu + on_cpu)
        assert_ran_once(database, on_gpu + on_cpu)

        wait_drained(task_events, gpu_worker.node, ON_GPU, JOBS)
        wait_drained(task_events, cpu_worker.node, ON_CPU, JOBS)
        drained = task_events.drained()
        assert drained[(gpu_worker.node, ON_GPU)] == JOBS
        assert drained[(cpu_worker.node, ON_CPU)] == JOBS
        taken = task_events.received()
        assert (cpu_worker.node, ON_GPU) not in taken
        assert (gpu_worker.node, ON_CPU) not in taken
        # Each worker loaded the models of its queue only (digits: neither serves it).
        assert "loaded model on-gpu:1" in gpu_worker.text()
        assert "loaded model on-cpu:1" not in gpu_worker.text()
        assert "loaded model on-cpu:1" in cpu_worker.text()
        assert "loaded model on-gpu:1" not in cpu_worker.text()
        assert "loaded model digits:1" not in gpu_worker.text() + cpu_worker.text()
    finally:
        gpu_worker.stop()


def test_a_cpu_worker_never_takes_a_gpu_models_jobs_even_with_no_gpu_worker(
    routed_app: Flask,
    routed_settings: Settings,
    database: Database,
    tenant: TenantAuth,
    task_events: TaskEvents,
    cpu_worker: Worker,
    gpu_folder: Path,
) -> None:
    on_gpu = submit(routed_app, tenant.headers, ON_GPU, 20)
    routed = container_of(routed_app)
    with routed.scope():  # the sweep's republish goes to the GPU queue too
        assert routed.worker.maintenance.wake_waiting(older_than_s=0) >= 20
    # A wake-up for the GPU model on the CPU queue (a waker with a stale card, or
    # none): the CPU worker passes it on to the GPU queue instead of running it.
    celery = container_of(routed_app).parts.celery
    celery.send_task(dispatch.DRAIN_TASK, args=[ON_GPU], queue=CPU)
    on_cpu = submit(routed_app, tenant.headers, ON_CPU, 20)
    wait_finished(database, on_cpu)
    assert_ran_once(database, on_cpu)
    wait_until(lambda: (cpu_worker.node, ON_GPU) in task_events.passed_on(),
               "the misrouted wake-up passed on", 30, interval=0.2)  # fmt: skip
    assert {(r.status, r.attempts) for r in rows(database, on_gpu)} == {("queued", 0)}
    assert (cpu_worker.node, ON_GPU) not in task_events.drained()
    assert "loaded model on-gpu:1" not in cpu_worker.text()

    gpu_worker = start_worker(routed_settings, gpu_folder, "gpu", GPU, task_events)
    try:
        wait_finished(database, on_gpu)
        assert_ran_once(database, on_gpu)
        wait_drained(task_events, gpu_worker.node, ON_GPU, len(on_gpu))
        assert task_events.drained()[(gpu_worker.node, ON_GPU)] == len(on_gpu)
        assert (cpu_worker.node, ON_GPU) not in task_events.drained()
    finally:
        gpu_worker.stop()
