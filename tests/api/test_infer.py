"""The sync door: KServe v2 infer (JSON and binary, Triton's own client), inline
models, timeouts that name the job, and `Prefer: wait` on POST /jobs."""

from __future__ import annotations

import json
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from tritonclient.utils import InferenceServerException

from app import create_app
from app.cards import ModelCard
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.sessions import SessionPool
from tests.conftest import LaneView, TenantAuth, lane_of, wait_for_job, wait_for_record
from tests.support import live_server, wait_until

RNG = np.random.default_rng(7)
PIXELS = (RNG.random((5, 64)) * 16).astype(np.float32)
INLINE = "digits-inline"
HEADER_LENGTH = "Inference-Header-Content-Length"


def direct(model_dir: Path, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the same file: the reference."""
    return SessionPool("cpu").run(ModelCard.load(model_dir), {"pixels": pixels})


def v2_body(pixels: np.ndarray, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "pixels", "shape": list(pixels.shape), "datatype": "FP32"}
    return {"inputs": [{**tensor, "data": pixels.reshape(-1).tolist()}], **extra}


@pytest.fixture(scope="module")
def sync_app(settings: Settings, model_repository: Path) -> Flask:
    """The test run's app, with an inline copy of digits in its repository."""
    inline = model_repository / INLINE / "1"
    if not inline.exists():
        shutil.copytree(model_repository / "digits" / "1", inline)
        card = json.loads((inline / "card.json").read_text())
        (inline / "card.json").write_text(json.dumps({**card, "execution": "inline"}))
    return create_app(settings)


@pytest.fixture
def sync_client(sync_app: Flask) -> FlaskClient:
    return sync_app.test_client()


@pytest.fixture(scope="module")
def server(sync_app: Flask) -> Iterator[str]:
    """The app over real HTTP on loopback, for Triton's client."""
    with live_server(sync_app) as served:
        yield served.address


def test_json_infer_through_the_workers_equals_onnx_runtime(
    sync_client: FlaskClient, tenant: TenantAuth, worker: Any, model_repository: Path,
    database: Database,
) -> None:  # fmt: skip
    response = sync_client.post(
        "/v2/models/digits/infer", json=v2_body(PIXELS, id="req-1"), headers=tenant.headers
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.json
    assert body["model_name"] == "digits" and body["id"] == "req-1"
    expected = direct(model_repository / "digits" / "1", PIXELS)
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["label"]["datatype"] == "INT64" and outputs["label"]["shape"] == [5]
    assert outputs["label"]["data"] == expected["label"].tolist()
    probabilities = np.asarray(outputs["probabilities"]["data"], dtype=np.float32)
    assert np.array_equal(probabilities.reshape(5, 10), expected["probabilities"])
    job_id = body["parameters"]["job_id"]  # its record, written behind the answer
    record = wait_for_record(sync_client, tenant.headers, job_id)
    assert (
        record["status"] == "succeeded" and record["outputs"]["label"] == expected["label"].tolist()
    )
    with database.sessionmaker() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None and job.tenant_id == tenant.id and job.compute_seconds
        assert job.created_at <= job.started_at <= job.finished_at


def test_binary_request_and_response_by_hand(
    sync_client: FlaskClient, tenant: TenantAuth, worker: Any, model_repository: Path
) -> None:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "shape": [5, 64],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": PIXELS.nbytes},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()
    response = sync_client.post(
        "/v2/models/digits/versions/1/infer",
        data=head + PIXELS.tobytes(),
        headers={
            **tenant.headers,
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        },
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    length = int(response.headers["Inference-Header-Content-Length"])
    raw = response.get_data()
    header = json.loads(raw[:length])
    [output] = header["outputs"]  # only the output asked for
    assert output["name"] == "probabilities" and output["parameters"]["binary_data_size"] == 200
    values = np.frombuffer(raw[length:], dtype="<f4").reshape(5, 10)
    assert np.array_equal(
        values, direct(model_repository / "digits" / "1", PIXELS)["probabilities"]
    )


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_works_unchanged(
    server: str, tenant: TenantAuth, worker: Any, model_repository: Path, binary: bool
) -> None:
    client = triton.InferenceServerClient(server)
    headers = tenant.headers
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits", headers=headers)
    assert not client.is_model_ready("no-such-model", headers=headers)
    metadata = client.get_model_metadata("digits", headers=headers)
    assert metadata["inputs"][0]["name"] == "pixels"
    pixels = triton.InferInput("pixels", list(PIXELS.shape), "FP32")
    pixels.set_data_from_numpy(PIXELS, binary_data=binary)
    outputs = [
        triton.InferRequestedOutput(n, binary_data=binary) for n in ("label", "probabilities")
    ]
    result = client.infer("digits", [pixels], outputs=outputs, headers=headers)
    expected = direct(model_repository / "digits" / "1", PIXELS)
    assert np.array_equal(result.as_numpy("label"), expected["label"])
    assert np.array_equal(result.as_numpy("probabilities"), expected["probabilities"])
    default = client.infer(INLINE, [pixels], headers=headers)  # no outputs named: all binary
    assert np.array_equal(default.as_numpy("probabilities"), expected["probabilities"])
    with pytest.raises(InferenceServerException) as refused:
        client.infer("digits", [pixels], model_version="99", headers=headers)
    assert refused.value.status() == "404" and "99" in refused.value.message()
    client.close()


def test_an_inline_model_runs_in_the_api_and_leaves_its_record(
    sync_client: FlaskClient, tenant: TenantAuth, model_repository: Path, database: Database
) -> None:
    response = sync_client.post(
        f"/v2/models/{INLINE}/infer", json=v2_body(PIXELS), headers=tenant.headers
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    job_id = response.json["parameters"]["job_id"]
    outputs = {o["name"]: o["data"] for o in response.json["outputs"]}
    expected = direct(model_repository / "digits" / "1", PIXELS)
    assert outputs["label"] == expected["label"].tolist()
    record = wait_for_record(sync_client, tenant.headers, job_id)
    assert record["status"] == "succeeded" and record["model"] == INLINE
    assert record["priority"] == 10 and record["attempts"] == 1
    assert record["outputs"]["label"] == expected["label"].tolist()
    assert record["compute_seconds"] > 0 and record["finished_at"] >= record["started_at"]
    with database.sessionmaker() as session:  # no inputs kept: nothing runs it again
        kept = session.scalar(select(Job.input_data).where(Job.id == job_id))
        assert kept is None
        assert session.scalar(select(func.count()).where(Job.tenant_id == tenant.id)) == 1
    usage = sync_client.get("/usage", headers=tenant.headers).json
    [line] = [m for m in usage["models"] if m["model"] == INLINE]
    assert line["jobs"] == 1 and line["succeeded"] == 1 and line["rows"] == len(PIXELS)


@pytest.mark.parametrize("model", ["digits", INLINE])
def test_non_finite_outputs_fail_the_call_with_422(
    sync_client: FlaskClient, tenant: TenantAuth, worker: Any, model: str
) -> None:
    huge = np.full((1, 64), 3e38, dtype=np.float32)
    response = sync_client.post(
        f"/v2/models/{model}/infer", json=v2_body(huge), headers=tenant.headers
    )
    assert response.status_code == 422, response.get_data(as_text=True)
    problem = response.json
    assert problem["type"] == "/problems/inference-failed"
    assert problem["error_code"] == "non_finite_output" and problem["error"] == problem["detail"]
    record = wait_for_record(sync_client, tenant.headers, problem["job_id"])
    assert record["status"] == "failed" and record["error"]["code"] == "non_finite_output"


def slow_body(seconds: float, timeout_us: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64},
            {"name": "steps", "shape": [1], "datatype": "INT64", "data": [int(seconds / 2e-6)]},
        ],
    }
    if timeout_us is not None:
        body["parameters"] = {"timeout": timeout_us}  # microseconds, as Triton's client sends it
    return body


def test_a_call_that_runs_out_of_time_names_its_record(
    sync_client: FlaskClient, tenant: TenantAuth, worker: Any
) -> None:
    body = slow_body(1.5, timeout_us=200_000)  # about 1.5 s of work, 0.2 s to wait
    response = sync_client.post("/v2/models/slow/infer", json=body, headers=tenant.headers)
    assert response.status_code == 504, response.get_data(as_text=True)
    problem = response.json
    assert problem["type"] == "/problems/sync-timeout" and problem["taken"] is True
    assert response.headers["Location"] == f"/jobs/{problem['job_id']}"
    record = wait_for_record(sync_client, tenant.headers, problem["job_id"])
    assert record["status"] == "succeeded", "a call a worker took runs, and is recorded"


def test_a_call_no_worker_took_in_time_is_withdrawn_and_never_runs(
    server: str, tenant: TenantAuth, worker: Any, database: Database, settings: Settings
) -> None:
    """Both worker children busy with slow calls: a third call waits on the lane,
    its caller gives up, and it is taken back unrun: no record, no charge."""
    base = f"http://{server}"
    busy = [
        threading.Thread(target=requests.post, args=(f"{base}/v2/models/slow/infer",),
                         kwargs={"json": slow_body(3.0), "headers": tenant.headers})
        for _ in range(2)
    ]  # fmt: skip
    for thread in busy:
        thread.start()
    lane = lane_of(settings)
    wait_until(lambda: recorded(database, tenant) == 0 and lane.waiting("slow") == 0
               and taken_slow(lane), "both slow calls to be taken", 30)  # fmt: skip
    late = requests.post(f"{base}/v2/models/slow/infer", json=slow_body(0.1, 300_000),
                         headers=tenant.headers, timeout=30)  # fmt: skip
    for thread in busy:
        thread.join(30)
    assert late.status_code == 504, late.text
    problem = late.json()
    assert problem["taken"] is False and "withdrawn unrun" in problem["detail"]
    assert lane.waiting("slow") == 0
    wait_until(lambda: recorded(database, tenant) == 2, "the two slow calls' records", 30)
    time.sleep(1.0)  # the writers' next round: still no record of the withdrawn call
    with database.sessionmaker() as session:
        assert session.get(Job, uuid.UUID(problem["job_id"])) is None


def recorded(database: Database, tenant: TenantAuth) -> int:
    with database.sessionmaker() as session:
        query = select(func.count()).select_from(Job).where(Job.tenant_id == tenant.id)
        return int(session.scalar(query) or 0)


def taken_slow(lane: LaneView) -> bool:
    """Whether two entries of `slow` sit in workers' taken lists."""
    return lane.taken("slow") == 2


def test_a_full_lane_refuses_at_once_with_retry_after(
    settings: Settings, tenant: TenantAuth, database: Database, worker: Any
) -> None:
    """A lane at its bound (SYNC_LANE_MAX_WAITING, here 0): the call is refused at
    once, 429 queue-full with Retry-After, nothing kept; never left to hang."""
    full = create_app(settings.model_copy(update={"sync_lane_max_waiting": 0})).test_client()
    started = time.monotonic()
    response = full.post("/v2/models/digits/infer", json=v2_body(PIXELS), headers=tenant.headers)
    assert time.monotonic() - started < 5, "refused at once, not after a wait"
    assert response.status_code == 429, response.get_data(as_text=True)
    assert response.json["type"] == "/problems/queue-full"
    assert "SYNC_LANE_MAX_WAITING" in response.json["detail"]
    assert int(response.headers["Retry-After"]) >= 1
    assert recorded(database, tenant) == 0


@pytest.mark.parametrize(
    ("headers", "body", "status", "field"),
    [
        ({HEADER_LENGTH: "9999"}, b"{}", 422, HEADER_LENGTH),
        ({HEADER_LENGTH: "13"}, b'{"inputs":[]}xx', 422, "body"),
        ({}, b"not json", 422, "body"),
        ({}, json.dumps({"inputs": {}}).encode(), 422, "inputs"),
        ({}, json.dumps({"inputs": [], "parameters": {"timeout": -1}}).encode(), 422,
         "parameters.timeout"),
        ({}, json.dumps(v2_body(PIXELS[:, :10])).encode(), 422, "pixels"),
        ({}, json.dumps({**v2_body(PIXELS), "outputs": [{"name": "nope"}]}).encode(), 422,
         "outputs"),
    ],
    ids=["header past the body", "bytes for no input", "not json", "inputs not a list",
         "bad timeout", "wrong shape", "unknown output"],
)  # fmt: skip
def test_bad_requests_get_problem_json_naming_the_field(
    sync_client: FlaskClient, tenant: TenantAuth, headers: dict[str, str], body: bytes,
    status: int, field: str,
) -> None:  # fmt: skip
    response = sync_client.post(
        f"/v2/models/{INLINE}/infer", data=body, headers={**tenant.headers, **headers}
    )
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.content_type == "application/problem+json"
    assert field in response.json["errors"], response.json
    assert response.json["error"] == response.json["detail"]  # what Triton's client shows


def test_binary_data_that_does_not_fit_its_shape_is_refused(
    sync_client: FlaskClient, tenant: TenantAuth
) -> None:
    head = json.dumps(
        {"inputs": [{"name": "pixels", "shape": [5, 64], "datatype": "FP32",
                     "parameters": {"binary_data_size": 12}}]}
    ).encode()  # fmt: skip
    response = sync_client.post(
        f"/v2/models/{INLINE}/infer",
        data=head + struct.pack("<3f", 1, 2, 3),
        headers={**tenant.headers, "Inference-Header-Content-Length": str(len(head))},
    )
    assert response.status_code == 422
    assert "does not fit shape [5, 64]" in response.json["detail"]


def test_an_anonymous_call_is_refused_before_its_body_is_read(sync_client: FlaskClient) -> None:
    response = sync_client.post(f"/v2/models/{INLINE}/infer", data=b"not even json")
    assert response.status_code == 401 and response.json["type"] == "/problems/unauthorized"


def test_model_ready_answers_by_status(sync_client: FlaskClient, tenant: TenantAuth) -> None:
    assert sync_client.get("/v2/models/digits/ready").status_code == 200
    assert sync_client.get("/v2/models/digits/versions/1/ready").status_code == 200
    missing = sync_client.get("/v2/models/digits/versions/7/ready")
    assert missing.status_code == 404 and missing.content_type == "application/problem+json"


def test_prefer_wait_returns_the_finished_job(
    sync_client: FlaskClient, tenant: TenantAuth, worker: Any
) -> None:
    body = {"model": "digits", "inputs": {"pixels": PIXELS[:1].tolist()}}
    response = sync_client.post("/jobs", json=body, headers={**tenant.headers, "Prefer": "wait=20"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json["status"] == "succeeded" and response.json["outputs"]["label"]
    assert response.headers["Preference-Applied"] == "wait=20"


def test_prefer_wait_that_runs_out_returns_202_with_the_job(
    sync_client: FlaskClient, tenant: TenantAuth, worker: Any
) -> None:
    body = {
        "model": "slow",
        "inputs": {"x": [[0.1] * 64], "steps": [int(2.5 / 2e-6)]},
    }
    prefer = {"Prefer": "respond-async, wait=1"}
    response = sync_client.post("/jobs", json=body, headers={**tenant.headers, **prefer})
    assert response.status_code == 202 and response.json["status"] in ("queued", "running")
    assert response.headers["Location"] == f"/jobs/{response.json['id']}"
    assert wait_for_job(sync_client, tenant.headers, response.json["id"])["status"] == "succeeded"
