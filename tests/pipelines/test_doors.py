"""The bundled pipelines on every door, run by a real worker: digit-photo (code,
the digits graph, code) and ingest (code, then MiniLM mapped over the chunks)
answer as their steps run by hand, and as the other doors answer each step; a
step that fails names itself and fails only its own job; Triton's clients see a
pipeline as a model (platform ensemble, its steps in its configuration)."""

from __future__ import annotations

import base64
import json
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import sqlalchemy as sa
import tritonclient.grpc as triton
from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.container import Container
from app.grpc.server import door_settings, start
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime import code
from tests.code.folders import digit_png
from tests.conftest import TenantAuth, WorkerProcess, job_run, wait_for_job

DIGITS = load_digits()


def by_hand(repository: Path, pngs: list[bytes]) -> tuple[list[int], list[float]]:
    """digit-photo's steps run here: digit-decode's code, ORT on digits, the max."""
    decode = code.load_module(repository / "digit-decode" / "1" / "model.py", "decode-by-hand")
    pixels = np.stack([decode.pixels(png) for png in pngs])
    session = ort.InferenceSession(str(repository / "digits" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    labels, probabilities = session.run(["label", "probabilities"], {"pixels": pixels})
    return [int(v) for v in labels], [float(v) for v in probabilities.max(axis=1)]


def streamed(grpc: triton.InferenceServerClient, key: dict[str, str],
             pngs: list[bytes]) -> list[tuple[int, float]]:  # fmt: skip
    """Each photo a request of one ModelStreamInfer stream (Triton's decoupled door)."""
    got: dict[str, Any] = {}
    done = threading.Event()

    def answered(result: Any, error: Any) -> None:
        got[result.get_response().id if error is None else f"error {len(got)}"] = result or error
        if len(got) == len(pngs):
            done.set()

    grpc.start_stream(answered, headers=key)
    for i, png in enumerate(pngs):
        image = triton.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([png], dtype=object))
        grpc.async_stream_infer("digit-photo", [image], request_id=f"photo-{i}")
    assert done.wait(120), got
    grpc.stop_stream()
    results = [got[f"photo-{i}"] for i in range(len(pngs))]
    return [(int(r.as_numpy("digit")[0]), float(r.as_numpy("confidence")[0])) for r in results]


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


def test_digit_photo_answers_on_every_door_as_its_steps_by_hand(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess,
    settings: Settings, database: Database,
) -> None:  # fmt: skip
    pngs = [digit_png(DIGITS.data[i]) for i in (0, 7, 13, 21)]
    digits, confidences = by_hand(pipeline_models, pngs)
    answers: dict[str, list[tuple[int, float]]] = {}

    job = job_run(client, tenant.headers, {"model": "digit-photo",
                                           "inputs": {"image": [b64(pngs[0])]}})  # fmt: skip
    assert job["status"] == "succeeded", job
    answers["jobs"] = [(job["outputs"]["digit"][0], job["outputs"]["confidence"][0])]
    with database.sessionmaker() as session:  # one record a finished step
        steps = session.execute(sa.text("SELECT step, element FROM job_steps WHERE job_id = :id "
                                        "ORDER BY step"), {"id": job["id"]}).all()  # fmt: skip
    assert [tuple(s) for s in steps] == [("answer", -1), ("classify", -1), ("decode", -1)]

    bulk = client.post("/jobs/bulk", headers=tenant.headers, json={"jobs": [
        {"model": "digit-photo", "inputs": {"image": [b64(p)]}} for p in pngs]})  # fmt: skip
    assert bulk.status_code == 202, bulk.json
    done = [wait_for_job(client, tenant.headers, j["id"], 120) for j in bulk.json["jobs"]]
    answers["bulk"] = [(d["outputs"]["digit"][0], d["outputs"]["confidence"][0]) for d in done]

    tensor = {"name": "image", "shape": [len(pngs)], "datatype": "BYTES",
              "data": [b64(p) for p in pngs]}  # fmt: skip
    sync = client.post("/v2/models/digit-photo/infer", headers=tenant.headers,
                       json={"inputs": [tensor]})  # fmt: skip
    assert sync.status_code == 200, sync.json
    out = {o["name"]: o["data"] for o in sync.json["outputs"]}
    answers["v2 json"] = list(zip(out["digit"], out["confidence"], strict=True))

    blob = b"".join(struct.pack("<I", len(p)) + p for p in pngs)
    raw = {"name": "image", "shape": [len(pngs)], "datatype": "BYTES",
           "parameters": {"binary_data_size": len(blob)}}  # fmt: skip
    head = json.dumps({"inputs": [raw]}).encode()
    binary = client.post("/v2/models/digit-photo/infer", data=head + blob, headers={
        **tenant.headers, "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head))})  # fmt: skip
    assert binary.status_code == 200, binary.data[:300]
    out = {o["name"]: o["data"] for o in binary.json["outputs"]}
    answers["v2 binary"] = list(zip(out["digit"], out["confidence"], strict=True))

    running = start(Container(door_settings(settings)), "127.0.0.1", 0)
    try:
        grpc = triton.InferenceServerClient(f"127.0.0.1:{running.port}")
        key = {"authorization": tenant.headers["Authorization"]}
        image = triton.InferInput("image", [len(pngs)], "BYTES")
        image.set_data_from_numpy(np.array(pngs, dtype=object))
        result = grpc.infer("digit-photo", [image], headers=key)
        got = (result.as_numpy("digit").tolist(), result.as_numpy("confidence").tolist())
        answers["grpc"] = list(zip(*got, strict=True))
        answers["grpc stream"] = streamed(grpc, key, pngs)
        config = grpc.get_model_config("digit-photo", headers=key, as_json=True)["config"]
        assert config["platform"] == "ensemble"
        assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
            "digit-decode", "digits", "digit-answer"]  # fmt: skip
        grpc.close()
    finally:
        running.stop(0)
        running.container.close()

    expected = list(zip(digits, confidences, strict=True))
    for door, got in answers.items():
        want = expected[: len(got)]
        assert [d for d, _ in got] == [d for d, _ in want], door
        np.testing.assert_allclose([c for _, c in got], [c for _, c in want], rtol=1e-6,
                                   err_msg=door)  # fmt: skip
    metadata = client.get("/v2/models/digit-photo", headers=tenant.headers).json
    assert metadata["platform"] == "ensemble"
    http_config = client.get("/v2/models/digit-photo/config", headers=tenant.headers).json
    # (protobuf's JSON writes int64 as a string: the version aside, the same steps)
    pairs = zip(http_config["ensemble_scheduling"]["step"], config["ensemble_scheduling"]["step"],
                strict=True)  # fmt: skip
    for over_http, over_grpc in pairs:
        assert int(over_grpc.pop("model_version")) == over_http.pop("model_version") == -1
        assert over_http == over_grpc


def test_ingest_gives_each_chunks_embedding_as_minilm_gives_it_on_its_own(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess
) -> None:
    words = [f"{w}{i % 7}" for i, w in enumerate(("river stone light quiet north " * 30).split())]
    document = " ".join(words) + " Ünïcode ends it."
    job = job_run(client, tenant.headers, {"model": "ingest", "inputs": {"document": [document]}})
    assert job["status"] == "succeeded", job
    offsets, vectors = job["outputs"]["offsets"], np.array(job["outputs"]["vectors"])
    assert len(offsets) == len(vectors) == 4 and offsets[0][0] == 0
    assert offsets[-1][1] == len(document)
    chunks = [document[a:b] for a, b in offsets]
    tensor = {"name": "text", "shape": [len(chunks)], "datatype": "BYTES", "data": chunks}
    alone = client.post("/v2/models/minilm/infer", headers=tenant.headers,
                        json={"inputs": [tensor]})  # fmt: skip
    assert alone.status_code == 200, alone.json
    embedding = np.array(alone.json["outputs"][0]["data"]).reshape(len(chunks), 384)
    np.testing.assert_allclose(vectors, embedding, atol=1e-5)
    assert len(chunks[0].split()) == 40


def test_a_failing_step_fails_its_own_job_naming_the_step(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess
) -> None:
    good = b64(digit_png(DIGITS.data[3]))
    bad = b64(b"this is no picture at all")
    jobs = [{"model": "digit-photo", "inputs": {"image": [i]}} for i in (good, bad, good)]
    bulk = client.post("/jobs/bulk", headers=tenant.headers, json={"jobs": jobs})
    jobs = [wait_for_job(client, tenant.headers, j["id"], 120) for j in bulk.json["jobs"]]
    assert [j["status"] for j in jobs] == ["succeeded", "failed", "succeeded"]  # type: ignore
    error: dict[str, Any] = jobs[1]["error"]
    assert error["code"] == "code_error"
    assert error["message"].startswith(
        "step 'decode' (digit-decode:1): model.py preprocess: UnidentifiedImageError"
    )
