"""Generation as jobs: POST /jobs with the chat model, run by a real worker's decode loop."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.conftest import WorkerProcess, wait_for_job

pytestmark = pytest.mark.processes


def submit(client: FlaskClient, auth: dict[str, str], inputs: Any, **parameters: Any) -> str:
    body = {"model": "smollm2", "inputs": inputs, "parameters": {"temperature": 0, **parameters}}
    response = client.post("/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.json
    return str(response.json["id"])  # type: ignore[index]


def test_a_prompt_is_continued_greedily(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    job_id = submit(client, auth, {"prompt": "The capital of France is"}, max_tokens=3)
    job = wait_for_job(client, auth, job_id, timeout=120)
    assert job["status"] == "succeeded", job
    outputs = job["outputs"]
    assert outputs["text"] == " Paris.\n"
    assert outputs["finish_reason"] == "length"
    assert (outputs["prompt_tokens"], outputs["completion_tokens"]) == (5, 3)


def test_bulk_submits_take_the_same_request(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    jobs = [
        {"model": "smollm2", "inputs": {"prompt": "The capital of France is"},
         "parameters": {"max_tokens": 2, "temperature": 0}},
        {"model": "smollm2", "inputs": {"messages": [{"role": "user", "content": "What is 2+2?"}]},
         "parameters": {"max_tokens": 30, "temperature": 0, "stop": [" is"]}},
        {"model": "smollm2", "inputs": {"prompt": "x"}, "parameters": {"max_tokens": 99999}},
    ]  # fmt: skip
    response = client.post("/jobs/bulk", json={"jobs": jobs}, headers=auth)
    assert response.status_code == 202, response.json
    items = response.json["jobs"]  # type: ignore[index]
    assert items[2]["status"] == 422 and "max_tokens" in items[2]["detail"]
    first = wait_for_job(client, auth, items[0]["id"], timeout=120)
    second = wait_for_job(client, auth, items[1]["id"], timeout=120)
    assert first["outputs"]["text"] == " Paris."
    assert second["outputs"]["text"] == "The answer to this classic math problem"
    assert second["outputs"]["finish_reason"] == "stop"


def test_an_idempotency_key_tells_parameters_apart(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """The same key with the same inputs but other parameters is another request: 422."""
    body = {"model": "smollm2", "inputs": {"prompt": "The capital of France is"},
            "parameters": {"max_tokens": 2, "temperature": 0}}  # fmt: skip
    headers = {**auth, "Idempotency-Key": "same-key"}
    first = client.post("/jobs", json=body, headers=headers)
    again = client.post("/jobs", json=body, headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json["id"] == again.json["id"]  # type: ignore[index]
    other = {**body, "parameters": {"max_tokens": 3, "temperature": 0}}
    assert client.post("/jobs", json=other, headers=headers).status_code == 422
    wait_for_job(client, auth, first.json["id"], timeout=120)  # type: ignore[index]
