"""triage: the chat model as a pipeline's steps, on a real worker. Its label and
scores are what the chat model's own jobs score for the same messages, its summary
what the chat model's own job writes at temperature 0, made only when the label
asks for one; on the async and the sync door alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.web.context import container_of
from tests.conftest import TenantAuth, WorkerProcess, job_run

URGENT = "The server is down and customers cannot pay! Please help now."


def card(repository: Path) -> dict[str, Any]:
    return json.loads((repository / "triage" / "1" / "card.json").read_text())  # type: ignore[no-any-return]


def chat(step: dict[str, Any], message: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": step["parameters"]["system"]},
            {"role": "user", "content": message}]  # fmt: skip


def test_triage_labels_and_summarizes_as_the_chat_model_does_on_its_own(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess
) -> None:
    classify, summarize = card(pipeline_models)["steps"]
    job = job_run(client, tenant.headers, {"model": "triage", "inputs": {"message": [URGENT]}},
                  timeout=300)  # fmt: skip
    assert job["status"] == "succeeded", job
    label, scores, summary = (job["outputs"][k] for k in ("label", "scores", "summary"))
    labels = classify["parameters"]["labels"]
    scored = job_run(client, tenant.headers, {
        "model": "smollm2", "inputs": {"messages": chat(classify, URGENT)},
        "parameters": {"labels": labels}}, timeout=300)  # fmt: skip
    expected = json.loads(scored["outputs"]["label_scores"])
    np.testing.assert_allclose(scores, [expected[x] for x in labels], atol=1e-4)
    assert label == [max(expected, key=expected.get)]
    if label == ["urgent"]:
        written = job_run(client, tenant.headers, {
            "model": "smollm2", "inputs": {"messages": chat(summarize, URGENT)},
            "parameters": {"max_tokens": 40, "temperature": 0}}, timeout=300)  # fmt: skip
        assert summary == [written["outputs"]["text"]] and summary[0]
    else:
        assert summary == []
    body = {"inputs": [{"name": "message", "shape": [1], "datatype": "BYTES", "data": [URGENT]}]}
    sync = client.post("/v2/models/triage/infer", json=body, headers=tenant.headers)
    assert sync.status_code == 200, sync.json
    answered = {o["name"]: o["data"] for o in sync.json["outputs"]}
    assert answered["label"] == label and answered["summary"] == summary
    np.testing.assert_allclose(answered["scores"], scores, atol=1e-5)


def test_a_step_whose_condition_does_not_hold_gives_nothing_and_costs_nothing(
    pipeline_models: Path, app: Flask, client: FlaskClient, tenant: TenantAuth,
    worker: WorkerProcess, tmp_path: Path,
) -> None:  # fmt: skip
    quiet = card(pipeline_models)
    quiet["steps"][1]["when"] = {"classify.label": ["a label never scored"]}
    path = tmp_path / "quiet.json"
    path.write_text(json.dumps(quiet))
    if not (pipeline_models / "triage-quiet").exists():
        container_of(app).models.add(path, "triage-quiet")
    body = {"model": "triage-quiet", "inputs": {"message": [URGENT]}}
    job = job_run(client, tenant.headers, body, timeout=300)
    assert job["status"] == "succeeded", job
    labels = quiet["steps"][0]["parameters"]["labels"]
    assert job["outputs"]["summary"] == [] and job["outputs"]["label"][0] in labels
    assert sum(job["outputs"]["scores"]) == pytest.approx(1.0, abs=1e-5)
