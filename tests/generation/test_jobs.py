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
