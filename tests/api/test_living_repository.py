"""A living model repository: models added, rolled, unloaded and removed while the
service runs reach every door at once, on real worker processes, without a
restart; a call no live worker can take is refused at once; a sync call's id is
readable as soon as its caller has it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from flask import Flask

from app.container import Container
from app.execution import runs
from app.grpc.server import Running, door_settings, start
from app.jobs import staging
from app.platform.database import Database
from app.platform.settings import Settings
from app.sync import records
from app.web.context import container_of
from tests.conftest import LaneView, TenantAuth, WorkerProcess, make_tenant
from tests.models import user_model
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.processes

LIVENESS_S = 30  # a generous bound, so a test cannot hang; the benchmark times it


@pytest.fixture
def own_queue(settings: Settings) -> Settings:
    """Settings of a queue of this test's own: its lane is served by its worker alone."""
    return settings.with_overrides(jobs_queue=f"living-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def living_worker(own_queue: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(own_queue, tmp_path / "worker.log", concurrency=2)
    yield process
    process.stop()


@pytest.fixture
def grpc_door(own_queue: Settings) -> Iterator[Running]:
    running = start(Container(door_settings(own_queue)), "127.0.0.1", 0)
    yield running
    running.stop(0)
    running.container.close()


def key(tenant: TenantAuth) -> dict[str, str]:
    return {"authorization": tenant.headers["Authorization"]}


def names(kind: str) -> str:
    return f"{kind.replace('_', '-')}-{uuid.uuid4().hex[:6]}"


def http_json(app: Flask, model: str, tenant: TenantAuth, inputs: list[dict[str, Any]]) -> Any:
    return app.test_client().post(f"/v2/models/{model}/infer", json={"inputs": inputs},
                                  headers=tenant.headers)  # fmt: skip


def test_models_added_while_the_service_runs_answer_every_sync_door_at_once(
    own_queue: Settings, living_worker: WorkerProcess, make_app: Callable[..., Flask],
    serve: Callable[[Flask], LiveServer], grpc_door: Running, tenant: TenantAuth,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Three models a user adds (INT32 add/sub, BYTES, identity), each called at
    once on every sync door: KServe v2 over HTTP (JSON and binary, with Triton's
    own client) and gRPC (unary and streaming). Before the lane served whatever the
    repository holds, each waited 30 s and failed until the workers restarted."""
    app = make_app(own_queue)
    plane = container_of(app)
    simple, strings, identity = names("simple"), names("simple_string"), names("identity")
    for kind, name in (("simple", simple), ("simple_string", strings), ("identity", identity)):
        plane.models.add(user_model(kind, tmp_path), name)
    added_at = time.monotonic()

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    response = http_json(app, simple, tenant, [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.ravel().tolist()},
    ])  # fmt: skip
    first_answer_s = time.monotonic() - added_at
    assert response.status_code == 200, response.json
    outputs = {o["name"]: o["data"] for o in response.json["outputs"]}
    assert outputs["OUTPUT0"] == (a + b).ravel().tolist()
    assert outputs["OUTPUT1"] == (a - b).ravel().tolist()
    assert first_answer_s < LIVENESS_S

    server = serve(app)
    http = triton_http.InferenceServerClient(server.address)
    words = np.array([[f"word-{i}".encode() for i in range(16)]], dtype=np.object_)
    text = triton_http.InferInput("INPUT0", [1, 16], "BYTES")
    text.set_data_from_numpy(words, binary_data=True)
    answered = http.infer(strings, [text], headers=tenant.headers)
    assert answered.as_numpy("OUTPUT0").tolist() == words.tolist()

    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_door.port}")
    row = np.array([[0.5, -1.0, 2.0, 7.25]], dtype=np.float32)
    tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(row)
    unary = client.infer(identity, [tensor], headers=key(tenant))
    assert np.array_equal(unary.as_numpy("OUTPUT0"), row)

    got: list[Any] = []
    client.start_stream(lambda result, error: got.append(error or result), headers=key(tenant))
    pair = [triton_grpc.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    pair[0].set_data_from_numpy(a)
    pair[1].set_data_from_numpy(b)
    client.async_stream_infer(simple, pair, request_id="streamed")
    client.stop_stream()
    [streamed] = got
    assert not isinstance(streamed, Exception), streamed
    assert streamed.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    client.close()


def test_a_call_no_live_worker_can_take_is_refused_at_once_on_every_door(
    own_queue: Settings, make_app: Callable[..., Flask], grpc_door: Running,
    tenant: TenantAuth,
) -> None:  # fmt: skip
    """No worker serves this queue: the call is refused at once with 503 and
    Retry-After (gRPC UNAVAILABLE), naming the model and its queue, not after
    the sync timeout."""
    app = make_app(own_queue)
    pixels = [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]
    started = time.monotonic()
    response = http_json(app, "digits", tenant, pixels)
    assert response.status_code == 503, response.json
    problem = response.json
    assert problem["queue"] == own_queue.model_queue and "digits:1" in problem["detail"]
    assert int(response.headers["Retry-After"]) >= 1
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_door.port}")
    tensor = triton_grpc.InferInput("pixels", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(triton_grpc.InferenceServerException) as refused:
        client.infer("digits", [tensor], headers=key(tenant))
    assert refused.value.status() == str(grpc.StatusCode.UNAVAILABLE)
    assert own_queue.model_queue in str(refused.value.message())
    assert time.monotonic() - started < 10, "refused at once, not after the sync timeout"
    client.close()


def test_a_roll_reaches_another_process_and_an_unloaded_or_removed_version_stops_serving(
    own_queue: Settings, living_worker: WorkerProcess, make_app: Callable[..., Flask],
    tenant: TenantAuth, settings: Settings,
) -> None:  # fmt: skip
    """Version 2 added through one API process serves unversioned calls in another
    at once (announced: no wait for a poll); version 1 unloaded is refused by both
    while version 2 serves; the model removed is gone from every door, and the
    worker closes the sessions of what no longer serves."""
    here, there = make_app(own_queue), make_app(own_queue)
    digits = settings.model_repository / "digits" / "1" / "model.onnx"
    name = names("roll")
    plane = container_of(here)
    plane.models.add(digits, name)
    pixels = [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]
    first = wait_until(
        lambda: (r := http_json(there, name, tenant, pixels)).status_code == 200 and r,
        "the other process to serve the added model", LIVENESS_S, 0.01,
    )  # fmt: skip
    assert first.json["model_version"] == "1", first.json
    plane.models.add(digits, name)  # version 2
    wait_until(lambda: http_json(there, name, tenant, pixels).json["model_version"] == "2",
               "the other process to serve version 2", LIVENESS_S, 0.01)  # fmt: skip
    plane.models.unload(name, "1")
    wait_until(lambda: there.test_client().post(
        f"/v2/models/{name}/versions/1/infer", json={"inputs": pixels}, headers=tenant.headers,
    ).status_code == 404, "version 1 refused by the other process", LIVENESS_S, 0.01)  # fmt: skip
    assert http_json(there, name, tenant, pixels).status_code == 200
    plane.models.remove(name)
    for app in (here, there):
        wait_until(lambda app=app: http_json(app, name, tenant, pixels).status_code == 404,
                   "the removed model refused", LIVENESS_S, 0.01)  # fmt: skip
    wait_until(lambda: f"{name}:2" in closed_in(living_worker),
               "the worker to close the removed model's session", LIVENESS_S)  # fmt: skip
    assert f"{name}:1" in closed_in(living_worker)


def closed_in(worker: WorkerProcess) -> str:
    """What the worker's log says it closed."""
    return "\n".join(line for line in worker.log_path.read_text().splitlines()
                     if "closed the sessions of" in line)  # fmt: skip


def test_a_sync_calls_id_is_readable_while_its_record_waits_in_the_journal(
    app: Flask, tenant: TenantAuth, database: Database
) -> None:
    """A record journaled and not written yet (its writer is slow, or died): the
    id its caller was given answers GET /jobs/<id> at once, with the call's
    outputs, and its event stream ends with the terminal event; another tenant
    still gets 404."""
    plane = container_of(app)
    card = plane.parts.repository.resolve("digits")
    [ran] = runs.run_card(
        plane.parts.runner.sessions, card, [{"pixels": np.zeros((1, 64), np.float32)}]
    )
    assert isinstance(ran, runs.Ran)
    record = staging.call_record(("digits", "1"), 1, tenant.id, datetime.now(UTC), 0.001,
                                 outputs=ran.outputs)  # fmt: skip
    records.journal(plane.parts.lane.client, [record])  # as a lane worker does; no writer
    job_id = record["id"]
    client = app.test_client()
    got = client.get(f"/jobs/{job_id}", headers=tenant.headers)
    assert got.status_code == 200, got.json
    assert got.json["status"] == "succeeded"
    assert got.json["outputs"]["label"] == [int(np.argmax(ran.outputs["probabilities"]))]
    events = client.get(f"/jobs/{job_id}/events", headers=tenant.headers)
    assert events.status_code == 200 and "event: job.succeeded" in events.get_data(as_text=True)
    other = make_tenant(database)
    assert client.get(f"/jobs/{job_id}", headers=other.headers).status_code == 404
    assert client.get(f"/jobs/{uuid.uuid4()}", headers=tenant.headers).status_code == 404


def test_a_grpc_calls_id_is_readable_at_once(
    own_queue: Settings, living_worker: WorkerProcess, make_app: Callable[..., Flask],
    grpc_door: Running, tenant: TenantAuth,
) -> None:  # fmt: skip
    """gRPC ModelInfer answers with the call's job id; GET /jobs/<id> right after
    finds it every time (its record is written behind the answer)."""
    app = make_app(own_queue)
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_door.port}")
    tensor = triton_grpc.InferInput("pixels", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    reader = app.test_client()
    for _ in range(20):
        result = client.infer("digits", [tensor], headers=key(tenant))
        job_id = result.get_response().parameters["job_id"].string_param
        got = reader.get(f"/jobs/{job_id}", headers=tenant.headers)
        assert got.status_code == 200 and got.json["status"] == "succeeded", got.json
    client.close()
    assert LaneView(own_queue).waiting("digits") == 0
