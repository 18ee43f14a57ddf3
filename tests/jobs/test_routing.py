"""Routing: each model's wake-ups travel on the queue its card names, from every
door that wakes workers (submit, sync, batches, the sweep, a drain handing over).
No worker reads these queues here, so every wake-up can be counted where it lands."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from app import create_app
from app.cli.launcher import Launcher, inference_queues
from app.platform.database import Database
from app.platform.settings import Settings
from app.repository.registry import ModelRepository
from app.sync import lane
from app.sync.lane import Lane
from app.web.context import container_of, services
from tests.conftest import RUN_ID, TenantAuth, insert_queued_job
from tests.support import wait_until

GPU, CPU = f"routing-gpu-{RUN_ID}", f"routing-cpu-{RUN_ID}"
ROW = {"pixels": [[0.0] * 64]}


def stage(source: Path, root: Path, name: str, **card: object) -> None:
    """A copy of the digits model as `name`, its card changed by `card`."""
    shutil.copytree(source / "digits", root / name)
    path = root / name / "1" / "card.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **card}))


@pytest.fixture(scope="module")
def repository(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("routed-models")
    shutil.copytree(settings.model_repository / "digits", root / "digits")
    stage(settings.model_repository, root, "on-gpu", queue=GPU)
    stage(settings.model_repository, root, "on-cpu", queue=CPU)
    stage(settings.model_repository, root, "bad-queue", queue="gpu,cpu")
    return root


@pytest.fixture
def routed(settings: Settings, repository: Path) -> Iterator[Flask]:
    """An app on a default queue of its own, with models routed to GPU and CPU."""
    default = f"{settings.jobs_queue}-routing"
    app = create_app(settings.with_overrides(model_repository=repository, jobs_queue=default))
    yield app
    client = redis.Redis.from_url(settings.redis_url)
    client.delete(default, GPU, CPU)
    client.delete(*client.keys("inference:wake:*-routing*:*") or ["none"])
    client.delete(*client.keys(f"inference:wake:routing-*-{RUN_ID}:*") or ["none"])
    client.delete(lane.serving_key(GPU), lane.lane_key(GPU))


def waiting(app: Flask, queue: str) -> list[str]:
    """The models of the wake-ups waiting on `queue`."""
    client = redis.Redis.from_url(container_of(app).settings.redis_url)
    return [json.loads(m)["headers"]["argsrepr"] for m in client.lrange(queue, 0, -1)]


def test_a_card_names_its_queue_and_a_bad_name_is_refused(repository: Path) -> None:
    models = ModelRepository(repository)
    assert models.queue_of("on-gpu") == GPU and models.queue_of("on-cpu") == CPU
    assert models.queue_of("digits") is None, "bundled models stay on the default queue"
    assert models.queue_of("no-such-model") is None
    assert models.resolve("on-gpu").to_dict()["queue"] == GPU
    assert "queue" not in models.resolve("digits").to_dict()
    (bad,) = [s for s in models.index() if s.name == "bad-queue"]
    assert bad.state == "UNAVAILABLE" and "queue: a queue name" in bad.reason
    assert models.queues() == {GPU, CPU}


def test_submits_wake_each_models_own_queue(routed: Flask, auth: dict[str, str]) -> None:
    client = routed.test_client()
    for model in ("on-gpu", "on-cpu", "digits", "on-gpu"):
        response = client.post("/jobs", json={"model": model, "inputs": ROW}, headers=auth)
        assert response.status_code == 202, response.json
    default = container_of(routed).settings.jobs_queue
    assert waiting(routed, GPU) == ["['on-gpu']"], "one pending wake-up per model and queue"
    assert waiting(routed, CPU) == ["['on-cpu']"]
    assert waiting(routed, default) == ["['digits']"]
    flags = redis.Redis.from_url(container_of(routed).settings.redis_url)
    assert flags.exists(f"inference:wake:{GPU}:on-gpu")
    with routed.app_context():
        services().parts.dispatcher.taken("on-gpu")  # a GPU worker took it
    assert not flags.exists(f"inference:wake:{GPU}:on-gpu")


def test_the_sync_door_uses_its_models_queues_lane_and_batches_wake_it(
    routed: Flask, auth: dict[str, str]
) -> None:
    client = routed.test_client()
    body = {
        "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}],
        "parameters": {"timeout": 1_500_000},
    }
    # No worker serves the GPU queue: refused at once, naming the model and its queue.
    refused = client.post("/v2/models/on-gpu/infer", json=body, headers=auth)
    assert refused.status_code == 503 and refused.json["queue"] == GPU, refused.json
    assert "on-gpu:1" in refused.json["detail"] and int(refused.headers["Retry-After"]) >= 1
    # The test plays a GPU worker that registers and never takes: the call waits on
    # the GPU queue's lane (only that queue's workers take it), then answers 504.
    lanes = redis.Redis.from_url(container_of(routed).settings.redis_url)
    Lane(lanes, 16).register(f"test-gpu-{uuid.uuid4().hex[:6]}", [GPU], 30.0)
    got: dict[str, Any] = {}
    call = threading.Thread(target=lambda: got.update(
        response=client.post("/v2/models/on-gpu/infer", json=body, headers=auth)))  # fmt: skip
    call.start()
    on_gpu = lane.lane_key(GPU)
    wait_until(lambda: lanes.llen(on_gpu) == 1, "the call on the GPU queue's lane", 10)
    assert lane.decode(lanes.lindex(on_gpu, 0)).model == "on-gpu"  # type: ignore[arg-type]
    call.join(10)
    response = got["response"]
    assert response.status_code == 504 and response.json["taken"] is False, response.json
    assert lanes.llen(on_gpu) == 0  # withdrawn once its caller stopped waiting
    rows = {"pixels": [[0.0] * 64] * 3}
    response = client.post("/batches", json={"model": "on-cpu", "inputs": rows}, headers=auth)
    assert response.status_code == 202, response.json
    assert waiting(routed, GPU) == []  # the lane needs no wake-up
    assert waiting(routed, CPU) == ["['on-cpu']"]


def test_the_sweep_wakes_a_waiting_model_on_its_queue(
    routed: Flask, database: Database, tenant: TenantAuth
) -> None:
    """The sweep knows only the model's name: the repository gives its queue."""
    for model in ("on-gpu", "on-cpu"):
        insert_queued_job(database, tenant.id, ROW, model=model, enqueued_seconds_ago=600)
    with container_of(routed).scope():
        assert container_of(routed).worker.maintenance.wake_waiting(older_than_s=60) >= 2
    assert waiting(routed, GPU) == ["['on-gpu']"]
    assert waiting(routed, CPU) == ["['on-cpu']"]


def test_a_drain_hands_over_on_its_models_queue(routed: Flask) -> None:
    """A drain that stops with work left wakes through the same dispatcher."""
    with routed.app_context():
        assert services().parts.dispatcher.wake("on-cpu", force=True)
        assert services().parts.dispatcher.queue_for("on-cpu") == CPU
    assert waiting(routed, CPU) == ["['on-cpu']"]


def test_default_model_queue_moves_models_without_a_queue(
    settings: Settings, repository: Path, auth: dict[str, str]
) -> None:
    other = f"routing-default-{RUN_ID}"
    app = create_app(settings.with_overrides(model_repository=repository,
                                             default_model_queue=other))  # fmt: skip
    try:
        response = app.test_client().post(
            "/jobs", json={"model": "digits", "inputs": ROW}, headers=auth
        )
        assert response.status_code == 202, response.json
        assert waiting(app, other) == ["['digits']"]
        assert container_of(app).settings.inference_queues == (other, settings.jobs_queue)
    finally:
        client = redis.Redis.from_url(settings.redis_url)
        client.delete(other, f"inference:wake:{other}:digits")


def test_make_run_serves_every_queue_a_model_names_or_worker_queues(
    settings: Settings, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = ModelRepository(repository).queues()
    plain = Settings(model_repository=repository)
    assert inference_queues(plain, named).split(",") == ["inference", CPU, GPU]
    only = plain.with_overrides(worker_queues=("gpu", "inference"))
    assert inference_queues(only, named) == "gpu,inference"

    subject = Launcher(plain)
    monkeypatch.setattr(subject, "_spawn", lambda child: None)
    subject._start_children()
    (worker,) = [child for child in subject.children if child.name == "worker"]
    assert worker.args[worker.args.index("--queues") + 1] == f"inference,{CPU},{GPU}"


def test_worker_queues_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_QUEUES", " gpu, inference ,")
    monkeypatch.setenv("DEFAULT_MODEL_QUEUE", "cpu")
    settings = Settings.from_env()
    assert settings.worker_queues == ("gpu", "inference")
    assert settings.model_queue == "cpu"
    assert settings.inference_queues == ("gpu", "inference")
    monkeypatch.delenv("WORKER_QUEUES")
    assert Settings.from_env().inference_queues == ("cpu", "inference")
