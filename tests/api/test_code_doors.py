"""A model with its own code on every door, run by a real worker process (never
the API's): the photo classifier (Pillow decoding, the digits graph, an argmax)
answers the same on /jobs, bulk, KServe JSON and binary, and gRPC as its steps
run by hand; an exception fails its own job and not the others; code arrives by
`models add` or, where allowed, an operator's upload, never a tenant's."""

from __future__ import annotations

import base64
import io
import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from flask import Flask
from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.container import Container
from app.grpc.server import door_settings, start
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime import code
from app.tenancy.keys import create_operator_key
from app.web.context import container_of
from tests.code.folders import digit_png, photo_folder, whims_folder
from tests.conftest import TenantAuth, WorkerProcess, job_run, wait_for_job

PHOTO, WHIMS = "photo-code", "whims"
DIGITS = load_digits()


@pytest.fixture(scope="module")
def code_models(
    model_repository: Path, app: Flask, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The two code models beside the test models, added as `models add` adds them."""
    made, models = tmp_path_factory.mktemp("code"), container_of(app).models
    if not (model_repository / PHOTO).exists():
        folder = photo_folder(made / "photo", model_repository / "digits" / "1",
                              digit_png(DIGITS.data[7]))  # fmt: skip
        models.add(folder, PHOTO)
    if not (model_repository / WHIMS).exists():
        models.add(whims_folder(made / "whims"), WHIMS)
    return model_repository


def by_hand(folder: Path, pngs: list[bytes]) -> tuple[list[int], list[float]]:
    """The photo model's three steps, run here: its decoding, ORT, the argmax."""
    module = code.load_module(folder / "model.py", "photo-by-hand")
    pixels = np.stack([module.pixels(png) for png in pngs])
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    labels, probabilities = session.run(["label", "probabilities"], {"pixels": pixels})
    return [int(v) for v in labels], [float(v) for v in probabilities.max(axis=1)]


def binary_body(png: bytes) -> tuple[bytes, dict[str, str]]:
    blob = struct.pack("<I", len(png)) + png
    tensor = {"name": "image", "shape": [1], "datatype": "BYTES",
              "parameters": {"binary_data_size": len(blob)}}  # fmt: skip
    head = json.dumps({"inputs": [tensor]}).encode()
    return head + blob, {"Content-Type": "application/octet-stream",
                         "Inference-Header-Content-Length": str(len(head))}  # fmt: skip


def test_a_code_model_answers_the_same_on_every_door_as_its_steps_by_hand(
    code_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess,
    settings: Settings,
) -> None:  # fmt: skip
    pngs = [digit_png(DIGITS.data[i]) for i in (3, 8, 11)]
    digits, confidences = by_hand(code_models / PHOTO / "1", pngs)
    png, want = pngs[0], (digits[0], confidences[0])
    b64 = base64.b64encode(png).decode()
    answers: dict[str, tuple[int, float]] = {}

    job = job_run(client, tenant.headers, {"model": PHOTO, "inputs": {"image": [{"b64": b64}]}})
    assert job["status"] == "succeeded", job
    answers["jobs"] = (job["outputs"]["digit"][0], job["outputs"]["confidence"][0])

    bulk = client.post("/jobs/bulk", headers=tenant.headers, json={"jobs": [
        {"model": PHOTO, "inputs": {"image": [{"b64": base64.b64encode(p).decode()}]}}
        for p in pngs]})  # fmt: skip
    assert bulk.status_code in (200, 202, 207), bulk.json
    done = [wait_for_job(client, tenant.headers, item["id"], 120) for item in bulk.json["jobs"]]
    assert [d["outputs"]["digit"][0] for d in done] == digits
    np.testing.assert_allclose([d["outputs"]["confidence"][0] for d in done], confidences,
                               rtol=1e-6)  # fmt: skip

    tensor = {"name": "image", "shape": [1], "datatype": "BYTES", "data": [{"b64": b64}]}
    sync = client.post(f"/v2/models/{PHOTO}/infer", headers=tenant.headers,
                       json={"inputs": [tensor]})  # fmt: skip
    assert sync.status_code == 200, sync.json
    outputs = {o["name"]: o["data"] for o in sync.json["outputs"]}
    answers["v2 json"] = (outputs["digit"][0], outputs["confidence"][0])

    data, headers = binary_body(png)
    binary = client.post(f"/v2/models/{PHOTO}/infer", data=data,
                         headers={**tenant.headers, **headers})  # fmt: skip
    assert binary.status_code == 200, binary.data[:300]
    outputs = {o["name"]: o["data"] for o in binary.json["outputs"]}
    answers["v2 binary"] = (outputs["digit"][0], outputs["confidence"][0])

    running = start(Container(door_settings(settings)), "127.0.0.1", 0)
    try:
        grpc = triton.InferenceServerClient(f"127.0.0.1:{running.port}")
        image = triton.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([png], dtype=object))
        result = grpc.infer(PHOTO, [image],
                            headers={"authorization": tenant.headers["Authorization"]})  # fmt: skip
        answers["grpc"] = (int(result.as_numpy("digit")[0]),
                           float(result.as_numpy("confidence")[0]))  # fmt: skip
        grpc.close()
    finally:
        running.stop(0)
        running.container.close()

    for door, (digit, confidence) in answers.items():
        assert digit == want[0], door
        assert confidence == pytest.approx(want[1], rel=1e-6), door
    assert f"{PHOTO}:1" not in code.CODE.loaded(), "the API process ran the model's code"


def test_an_exception_in_the_code_fails_its_own_job_and_not_the_rest_of_its_batch(
    code_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess
) -> None:
    texts = ["hello", "raise", "world", "again"]
    bulk = client.post("/jobs/bulk", headers=tenant.headers, json={
        "jobs": [{"model": WHIMS, "inputs": {"text": [t]}} for t in texts]})  # fmt: skip
    jobs = [wait_for_job(client, tenant.headers, item["id"], 120) for item in bulk.json["jobs"]]
    assert [j["status"] for j in jobs] == ["succeeded", "failed", "succeeded", "succeeded"]
    failed = "model.py postprocess: ValueError: asked to fail"
    assert jobs[1]["error"] == {"code": "code_error", "message": failed}
    assert [j["outputs"]["shout"] for j in jobs if j["status"] == "succeeded"] == [
        ["HELLO"], ["WORLD"], ["AGAIN"]]  # fmt: skip
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["raise"]}
    sync = client.post(f"/v2/models/{WHIMS}/infer", headers=tenant.headers,
                       json={"inputs": [tensor]})  # fmt: skip
    assert sync.status_code == 422, sync.json
    assert "model.py postprocess: ValueError: asked to fail" in sync.json["detail"]


def zipped(folder: Path) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path in folder.iterdir():
            archive.write(path, path.name)
    return out.getvalue()


def test_code_is_uploaded_only_with_an_operator_key_where_allowed(
    database: Database, client: FlaskClient, tenant: TenantAuth, make_app: Callable[..., Flask],
    tmp_path: Path,
) -> None:  # fmt: skip
    with database.sessionmaker.begin() as session:
        operator = {"Authorization": f"Bearer {create_operator_key(session)}"}
    archive = zipped(whims_folder(tmp_path / "whims"))

    def put(app_client: FlaskClient, headers: dict[str, str], name: str) -> Any:
        headers = {**headers, "Content-Type": "application/octet-stream"}
        return app_client.put(f"/v2/repository/models/{name}/versions/1", data=archive,
                              headers=headers)  # fmt: skip

    assert put(client, tenant.headers, "uploaded-code").status_code == 403
    refused = put(client, operator, "uploaded-code")
    assert refused.status_code == 403, refused.json
    assert "ALLOW_CODE_UPLOADS" in refused.json["detail"] and "model.py" in refused.json["detail"]
    allowed = make_app(allow_code_uploads=True).test_client()
    assert put(allowed, tenant.headers, "uploaded-code").status_code == 403
    added = put(allowed, operator, "uploaded-code")
    assert added.status_code == 201, added.json
    assert added.json["card"]["platform"] == "python"
    assert [s["name"] for s in added.json["card"]["outputs"]] == ["shout"]
