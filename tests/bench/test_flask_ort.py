"""The bare Flask + ONNX Runtime contender answers what ONNX Runtime answers, in the
v2 JSON the service's sync door speaks, and is served as the service's API is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.cli.launcher import api_command
from app.platform.settings import ROOT
from bench.contenders.flask_ort import gunicorn_command
from bench.load import infer_bodies
from bench.peers import flask_ort
from bench.peers.raw_ort import model_file
from modelbuild.bundled import ensure_models


@pytest.fixture(scope="module")
def digits() -> Path:
    ensure_models(ROOT / "models")
    path = model_file(ROOT / "models", "digits")
    assert path is not None
    return path


@pytest.fixture
def client(digits: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlaskClient]:
    monkeypatch.setattr(flask_ort, "MODELS", digits.parent.parent.parent)
    monkeypatch.setattr(flask_ort, "_sessions", {})
    yield flask_ort.app.test_client()


def test_answer_equals_onnx_runtime_on_the_same_rows(client: FlaskClient, digits: Path) -> None:
    rows = load_digits().data[:5]
    session = ort.InferenceSession(str(digits), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(["label", "probabilities"],
                                       {"pixels": rows.astype(np.float32)})  # fmt: skip
    for i, body in enumerate(infer_bodies(rows.tolist())):  # the bench's own bodies
        answer = client.post("/v2/models/digits/infer", data=body,
                             content_type="application/json")  # fmt: skip
        assert answer.status_code == 200
        v2 = answer.get_json()
        assert v2["id"] == str(i) and v2["model_name"] == "digits"
        outputs = {o["name"]: o for o in v2["outputs"]}
        assert outputs["label"]["datatype"] == "INT64" and outputs["label"]["shape"] == [1]
        assert outputs["label"]["data"] == [int(label[i])]
        assert outputs["probabilities"]["shape"] == [1, 10]
        got = np.asarray(outputs["probabilities"]["data"], dtype=np.float32)
        np.testing.assert_array_equal(got, probabilities[i])


def test_bad_requests_are_refused(client: FlaskClient) -> None:
    wrong_width = {"inputs": [{"name": "pixels", "shape": [1, 3], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0]}]}  # fmt: skip
    assert client.post("/v2/models/digits/infer", json=wrong_width).status_code == 400
    assert client.post("/v2/models/digits/infer", data=b"{").status_code == 400
    assert client.post("/v2/models/nothing/infer", json=wrong_width).status_code == 404


def test_served_by_gunicorn_with_the_service_apis_processes_and_threads() -> None:
    peer, service = gunicorn_command("127.0.0.1:1"), api_command("127.0.0.1:1")
    assert peer[1:3] == ["-m", "gunicorn"] and peer[-1] == "bench.peers.flask_ort:app"
    assert peer[peer.index("--worker-class") + 1] == "gthread"
    for option in ("--workers", "--threads"):
        assert peer[peer.index(option) + 1] == service[service.index(option) + 1]
