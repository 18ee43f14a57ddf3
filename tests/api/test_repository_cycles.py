"""A repository changed for months: models added, loaded, unloaded and removed
while a worker serves leave nothing behind in its children. Each child holds as
many threads and sockets with 40 lane models as with 5 (one lane consumer per
queue, not per model), and after 20 cycles of an ONNX model and a second copy of
the chat model added, called, unloaded and removed, its memory is where it was
after the first cycle (their sessions, decode engines and caches are closed)."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from flask import Flask

from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import TenantAuth, WorkerProcess, wait_for_job
from tests.support import link_chat_model, wait_until

pytestmark = pytest.mark.processes

CYCLES = 20
PIXELS = [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]


@pytest.fixture
def own(settings: Settings, tmp_path: Path) -> Settings:
    """A repository and a queue of this test's own: digits and three copies (four
    lane models), served by its worker alone."""
    root = tmp_path / "models"
    for name in ("digits", "lane-a", "lane-b", "lane-c"):
        shutil.copytree(settings.model_repository / "digits", root / name)
    return settings.with_overrides(model_repository=root,
                                   jobs_queue=f"cycles-{uuid.uuid4().hex[:8]}")  # fmt: skip


@pytest.fixture
def cycle_worker(own: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(own, tmp_path / "worker.log", concurrency=2, DRAIN_LINGER_MS="0")
    yield process
    process.stop()


def children(worker: WorkerProcess) -> list[psutil.Process]:
    return psutil.Process(worker.proc.pid).children()


def census(worker: WorkerProcess) -> dict[int, tuple[int, int]]:
    """Each child's threads and open sockets (Redis and PostgreSQL) once steady:
    the same in three looks half a second apart (a socket opened and closed
    meanwhile is not one it holds; one opened late, such as the record writer's
    at its first flush, is)."""
    looks: list[dict[int, tuple[int, int]]] = []

    def steady() -> dict[int, tuple[int, int]] | None:
        looks.append({c.pid: (c.num_threads(), len(c.net_connections(kind="all")))
                      for c in children(worker)})  # fmt: skip
        return looks[-1] if len(looks) >= 3 and looks[-1] == looks[-2] == looks[-3] else None

    return wait_until(steady, lambda: f"children steady: {looks[-3:]}", interval=0.5)


def call(app: Flask, model: str, tenant: TenantAuth) -> None:
    response = app.test_client().post(f"/v2/models/{model}/infer", json={"inputs": PIXELS},
                                      headers=tenant.headers)  # fmt: skip
    assert response.status_code == 200, (model, response.json)


def call_each(app: Flask, models: list[str], tenant: TenantAuth) -> None:
    """Two rounds, so each model is likely to run in both children."""
    for _ in range(2):
        for model in models:
            call(app, model, tenant)


def generate(app: Flask, model: str, tenant: TenantAuth) -> None:
    body = {"model": model, "inputs": {"prompt": "The capital of France is"},
            "parameters": {"max_tokens": 2, "temperature": 0}}  # fmt: skip
    client = app.test_client()
    submitted = client.post("/jobs", json=body, headers=tenant.headers)
    assert submitted.status_code == 202, submitted.json
    done = wait_for_job(client, tenant.headers, submitted.json["id"], timeout=120)
    assert done["status"] == "succeeded", done


def rss_mb(worker: WorkerProcess) -> dict[int, float]:
    return {c.pid: c.memory_info().rss / 2**20 for c in children(worker)}


def test_repository_cycles_leave_no_threads_sockets_or_memory_behind(
    own: Settings, cycle_worker: WorkerProcess, make_app: Callable[..., Flask],
    tenant: TenantAuth,
) -> None:  # fmt: skip
    app = make_app(own)
    models = container_of(app).models
    digits = own.model_repository / "digits" / "1" / "model.onnx"
    lane = ["digits", "lane-a", "lane-b", "lane-c", "lane-d"]
    models.add(digits, "lane-d")  # one added while it runs: what that opens is open already
    call_each(app, lane, tenant)
    with_5 = census(cycle_worker)
    more = [f"lane-{i:02d}" for i in range(35)]
    for name in more:
        models.add(digits, name)
    call_each(app, lane + more, tenant)
    with_40 = census(cycle_worker)
    assert with_40 == with_5, f"threads and sockets per child: {with_5} with 5, {with_40} with 40"
    for name in more:
        models.remove(name)

    after_first: dict[int, float] = {}
    figures: list[dict[int, float]] = []
    for cycle in range(CYCLES):
        name, chat = f"cycle-{cycle}", f"chat-cycle-{cycle}"
        models.add(digits, name)
        link_chat_model(own.model_repository, chat)
        models.load(chat)
        call_each(app, [name], tenant)
        generate(app, chat, tenant)
        models.unload(name)
        models.unload(chat)
        models.remove(name)
        models.remove(chat)
        wait_until(lambda chat=chat: closed(cycle_worker, chat), f"{chat}'s engine closed", 60)
        time.sleep(1.0)  # the children's watches: what no longer serves is closed
        figures.append(rss_mb(cycle_worker))
        if cycle == 0:
            after_first = figures[0]
    last = figures[-1]
    report = {pid: [round(f[pid]) for f in figures if pid in f] for pid in after_first}
    assert set(last) == set(after_first), f"a child was replaced: {report}"
    for pid, first in after_first.items():
        assert last[pid] <= first * 1.10, f"child {pid} grew past 10% (MB by cycle): {report}"
    print(json.dumps({"rss_mb_by_cycle": report, "with_5": with_5, "with_40": with_40}))


def closed(worker: WorkerProcess, ref_prefix: str) -> bool:
    """Whether the worker's log says the chat copy's sessions were closed."""
    return any(ref_prefix in line and "closed the sessions of" in line
               for line in worker.log_path.read_text().splitlines())  # fmt: skip
