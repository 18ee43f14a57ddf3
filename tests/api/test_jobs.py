"""POST /jobs -> worker -> GET /jobs/<id>, on real PostgreSQL, Redis and a worker process."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.platform.settings import Settings
from app.repository.registry import ModelRepository
from app.web.context import container_of
from tests.conftest import WorkerProcess, make_tenant, wait_for_job

pytestmark = pytest.mark.usefixtures("worker")

DIGITS, TARGETS = load_digits(return_X_y=True)


def direct_run(repo: ModelRepository, rows: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the same model file."""
    card = repo.resolve("digits")
    session = ort.InferenceSession(str(card.onnx_path), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(None, {"pixels": rows.astype(np.float32)})
    return {"label": label, "probabilities": probabilities}


def submit(client: FlaskClient, auth: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.json
    job: dict[str, Any] = response.json  # type: ignore[assignment]
    assert response.headers["Location"] == f"/jobs/{job['id']}"
    assert job["status"] == "queued"
    return job


def test_round_trip_outputs_equal_direct_onnx_runtime(
    client: FlaskClient, auth: dict[str, str], app: Any
) -> None:
    rows = DIGITS[:5]
    job = submit(client, auth, {"model": "digits", "inputs": {"pixels": rows.tolist()}})
    done = wait_for_job(client, auth, job["id"])

    assert done["status"] == "succeeded", done
    expected = direct_run(container_of(app).parts.repository, rows)
    assert np.array_equal(np.array(done["outputs"]["label"]), expected["label"])
    got = np.array(done["outputs"]["probabilities"], dtype=np.float32)
    assert np.array_equal(got, expected["probabilities"])  # bit for bit, not approximately
    assert done["outputs"]["label"] == TARGETS[:5].tolist()
    assert done["model"] == "digits" and done["model_version"] == "1"
    assert done["attempts"] == 1 and done["error"] is None
    assert done["started_at"] and done["finished_at"]
    assert done["queued_seconds"] >= 0 and done["running_seconds"] >= 0


def test_nothing_piles_up_in_redis(
    client: FlaskClient, auth: dict[str, str], settings: Settings
) -> None:
    """Job state lives in PostgreSQL: no Celery results are stored in Redis."""
    job = submit(client, auth, {"model": "digits", "inputs": {"pixels": [DIGITS[0].tolist()]}})
    wait_for_job(client, auth, job["id"])
    broker = redis.Redis.from_url(settings.redis_url)
    assert broker.keys("celery-task-meta-*") == []
    assert broker.llen(settings.jobs_queue) == 0


def test_kserve_v2_tensor_form(client: FlaskClient, auth: dict[str, str], app: Any) -> None:
    rows = DIGITS[10:13]
    tensor = {"name": "pixels", "shape": [3, 64], "datatype": "FP32", "data": rows.ravel().tolist()}
    job = submit(client, auth, {"model": "digits", "version": "1", "inputs": [tensor]})
    done = wait_for_job(client, auth, job["id"])

    expected = direct_run(container_of(app).parts.repository, rows)
    assert done["status"] == "succeeded"
    assert done["outputs"]["label"] == expected["label"].tolist()
    assert np.array_equal(
        np.array(done["outputs"]["probabilities"], dtype=np.float32), expected["probabilities"]
    )


def test_list_is_newest_first_filtered_and_paginated(
    client: FlaskClient, auth: dict[str, str]
) -> None:
    ids = [
        submit(client, auth, {"model": "digits", "inputs": {"pixels": [DIGITS[i].tolist()]}})["id"]
        for i in range(5)
    ]
    for job_id in ids:
        wait_for_job(client, auth, job_id)

    seen, cursor = [], None
    while True:
        query = {"limit": 2, "model": "digits", **({"cursor": cursor} if cursor else {})}
        page = client.get("/jobs", query_string=query, headers=auth).json
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))

    succeeded = client.get("/jobs?status=succeeded&limit=200", headers=auth).json["items"]
    assert {j["id"] for j in succeeded} == set(ids)
    assert client.get("/jobs?status=failed", headers=auth).json["items"] == []


def test_tenant_isolation(client: FlaskClient, auth: dict[str, str], database: Any) -> None:
    job = submit(client, auth, {"model": "digits", "inputs": {"pixels": [DIGITS[0].tolist()]}})
    other = make_tenant(database).headers

    response = client.get(f"/jobs/{job['id']}", headers=other)
    assert response.status_code == 404
    assert response.content_type == "application/problem+json"
    assert job["id"] not in {j["id"] for j in client.get("/jobs", headers=other).json["items"]}
    assert client.get(f"/jobs/{job['id']}", headers=auth).status_code == 200


def test_unknown_job_is_404(client: FlaskClient, auth: dict[str, str]) -> None:
    response = client.get(f"/jobs/{uuid.uuid4()}", headers=auth)
    assert response.status_code == 404
    assert response.json["type"] == "/problems/not-found"


def test_jobs_wait_for_a_worker_and_complete_when_one_starts(
    auth: dict[str, str],
    settings: Settings,
    tmp_path: Path,
    make_app: Callable[..., Flask],
) -> None:
    """With no worker on its queue a job stays queued, and is not lost: it completes
    once a worker starts."""
    lonely = settings.with_overrides(jobs_queue=f"{settings.jobs_queue}-late")
    client = make_app(lonely).test_client()
    queued = [
        submit(client, auth, {"model": "digits", "inputs": {"pixels": [row.tolist()]}})
        for row in DIGITS[:3]
    ]
    time.sleep(0.5)
    assert {client.get(f"/jobs/{j['id']}", headers=auth).json["status"] for j in queued} == {
        "queued"
    }

    late_worker = WorkerProcess(lonely, tmp_path / "late-worker.log")
    try:
        done = [wait_for_job(client, auth, j["id"]) for j in queued]
    finally:
        late_worker.stop()
    assert [d["outputs"]["label"][0] for d in done] == TARGETS[:3].tolist()
