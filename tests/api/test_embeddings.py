"""Sentence embeddings through the service's doors, on real workers: an async
job, the sync KServe door (JSON, and Triton's client with binary BYTES) and
micro-batches of several jobs all give sentence-transformers' vectors."""

from __future__ import annotations

import io
import json
import shutil
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import tritonclient.http as triton
from flask import Flask
from flask.testing import FlaskClient

from app.jobs.tables import Job
from app.platform.database import Database
from app.repository.registry import ModelRepository
from app.runtime.engine import infer
from app.runtime.sessions import SessionPool
from app.runtime.tensors import pack, parse_inputs
from app.web.context import services
from tests.conftest import TenantAuth, outputs_of, wait_for_job
from tests.support import live_server, wait_until

DATA = Path(__file__).parent.parent / "data"
REFERENCE = json.loads((DATA / "minilm_reference.json").read_text(encoding="utf-8"))
SENTENCES: list[str] = REFERENCE["sentences"]
EXPECTED = np.asarray(REFERENCE["embeddings"], dtype=np.float32)
# A copy of minilm that no submit wakes: the batching test queues jobs, then wakes it.
STAGED = "minilm-staged"


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        (a * b).sum(axis=-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    )


def assert_reference(vectors: Any, rows: slice = slice(None)) -> np.ndarray:
    array = np.asarray(vectors, dtype=np.float32)
    assert array.shape == EXPECTED[rows].shape
    assert cosine(array, EXPECTED[rows]).min() >= 0.999
    return array


@pytest.fixture(scope="module")
def staged(model_repository: Path) -> str:
    if not (model_repository / STAGED).exists():
        shutil.copytree(model_repository / "minilm", model_repository / STAGED)
    return STAGED


@pytest.fixture(scope="module")
def server(app: Flask) -> Iterator[str]:
    """The app over real HTTP on loopback, for Triton's client."""
    with live_server(app) as served:
        yield served.address


@pytest.mark.usefixtures("worker")
def test_an_async_job_and_the_sync_door_give_the_reference_vectors(
    client: FlaskClient, tenant: TenantAuth
) -> None:
    body = {"model": "minilm", "inputs": {"text": SENTENCES}}
    response = client.post("/jobs", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.get_data(as_text=True)
    job = wait_for_job(client, tenant.headers, response.json["id"], timeout=60)
    assert job["status"] == "succeeded", job
    from_job = assert_reference(job["outputs"]["embedding"])

    v2 = {"name": "text", "shape": [len(SENTENCES)], "datatype": "BYTES", "data": SENTENCES}
    response = client.post("/v2/models/minilm/infer", json={"inputs": [v2]}, headers=tenant.headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    [output] = response.json["outputs"]
    assert output["name"] == "embedding" and output["datatype"] == "FP32"
    assert output["shape"] == [len(SENTENCES), 384]
    from_sync = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    assert np.allclose(from_sync, from_job, atol=1e-5)


@pytest.mark.usefixtures("worker")
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_sends_bytes_and_gets_the_reference_vectors(
    server: str, tenant: TenantAuth, binary: bool
) -> None:
    client = triton.InferenceServerClient(server)
    metadata = client.get_model_metadata("minilm", headers=tenant.headers)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    text = triton.InferInput("text", [len(SENTENCES)], "BYTES")
    text.set_data_from_numpy(
        np.array([s.encode() for s in SENTENCES], dtype=object), binary_data=binary
    )
    wanted = [triton.InferRequestedOutput("embedding", binary_data=binary)]
    result = client.infer("minilm", [text], outputs=wanted, headers=tenant.headers)
    assert_reference(result.as_numpy("embedding"))
    client.close()


@pytest.mark.usefixtures("worker")
def test_jobs_of_different_lengths_batched_by_the_worker_equal_one_at_a_time(
    app: Flask, database: Database, tenant: TenantAuth, staged: str, model_repository: Path
) -> None:
    card = ModelRepository(model_repository).resolve(staged)
    texts = [SENTENCES[i : i + n] for i, n in
             [(0, 1), (8, 1), (1, 3), (5, 1), (4, 2), (0, 2), (7, 2), (3, 1)] * 3]  # fmt: skip
    ids = []
    with database.sessionmaker() as session:
        for batch in texts:
            job = Job(
                id=uuid.uuid4(), tenant_id=tenant.id, model=staged, model_version="1",
                status="queued", attempts=0, batch_rows=len(batch),
                input_data=pack(parse_inputs(card, {"text": batch})),
            )  # fmt: skip
            session.add(job)
            ids.append(job.id)
        session.commit()
    with app.app_context():
        assert services().parts.dispatcher.wake(staged)
    for job_id in ids:
        job = wait_for_job(app.test_client(), tenant.headers, str(job_id), timeout=60)
        assert job["status"] == "succeeded", job
    with database.sessionmaker() as session:
        jobs = {
            j.id: j
            for j in session.scalars(
                sa.select(Job).where(Job.id.in_(ids)).options(sa.orm.undefer(Job.output_data))
            )
        }
    claims = {job.started_at for job in jobs.values()}
    assert len(claims) < len(ids), "jobs were claimed together, so batched"
    pool = SessionPool("cpu", 1)
    for job_id, batch in zip(ids, texts, strict=True):
        [alone] = infer(pool, card, [parse_inputs(card, {"text": batch})])
        assert not isinstance(alone, Exception)
        outputs = outputs_of(jobs[job_id])
        assert outputs is not None
        together = np.asarray(outputs["embedding"], dtype=np.float32)
        assert np.allclose(together, alone["embedding"], atol=1e-5)
        assert cosine(together, alone["embedding"]).min() > 0.99999


def binary_body(texts: list[bytes], shape: int | None = None) -> tuple[bytes, dict[str, str]]:
    blob = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    head = json.dumps(
        {"inputs": [{"name": "text", "shape": [shape or len(texts)], "datatype": "BYTES",
                     "parameters": {"binary_data_size": len(blob)}}]}
    ).encode()  # fmt: skip
    headers = {"Content-Type": "application/octet-stream",
               "Inference-Header-Content-Length": str(len(head))}  # fmt: skip
    return head + blob, headers


@pytest.mark.parametrize(
    ("door", "body", "message"),
    [
        ("jobs", {"model": "minilm", "inputs": {"text": [1, 2]}}, "element 0 is a number"),
        ("jobs", {"model": "minilm", "inputs": {"text": "one string"}},
         "must be a list of strings"),
        ("jobs", {"model": "minilm", "inputs": [{"name": "text", "shape": [1],
                                                 "datatype": "FP32", "data": [1.0]}]},
         "expected BYTES"),
        ("v2", {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                            "data": ["ok", 3]}]}, "element 1 is a number"),
        ("v2", binary_body([b"fine", b"\xc3\x28"]), "element 1 is not UTF-8"),
        ("v2", binary_body([b"one"], shape=2), "element 1 has no 4-byte length"),
    ],
    ids=["numbers", "a bare string", "a float tensor", "a number in v2 json",
         "binary not utf-8", "binary short of its shape"],
)  # fmt: skip
def test_bad_text_gets_422_problem_json(
    client: FlaskClient, tenant: TenantAuth, door: str, body: Any, message: str
) -> None:
    if door == "jobs":
        response = client.post("/jobs", json=body, headers=tenant.headers)
    elif isinstance(body, tuple):
        data, headers = body
        response = client.post(
            "/v2/models/minilm/infer", data=data, headers={**tenant.headers, **headers}
        )
    else:
        response = client.post("/v2/models/minilm/infer", json=body, headers=tenant.headers)
    assert response.status_code == 422, response.get_data(as_text=True)
    assert response.content_type == "application/problem+json"
    assert message in response.json["detail"], response.json


@pytest.mark.usefixtures("worker")
def test_a_batch_of_texts_gives_the_reference_vectors_in_order(
    client: FlaskClient, tenant: TenantAuth
) -> None:
    """The third door: a .jsonl file of texts, a row per line, more rows than one
    ONNX Runtime call takes (max_batch_size 32), results in input order."""
    texts = SENTENCES * 5
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    upload = client.post("/files?filename=texts.jsonl", data=data, headers=tenant.headers)
    assert upload.status_code == 201, upload.json
    body = {"model": "minilm", "file_id": upload.json["id"]}
    batch = client.post("/batches", json=body, headers=tenant.headers)
    assert batch.status_code == 202, batch.json
    url = f"/batches/{batch.json['id']}"

    def finished() -> dict[str, Any] | None:
        state: dict[str, Any] = client.get(url, headers=tenant.headers).json
        return None if state["status"] in ("queued", "running") else state

    state = wait_until(finished, "the batch to finish", 60)
    assert state["status"] == "succeeded" and state["rows_done"] == len(texts), state
    npy = {**tenant.headers, "Accept": "application/x-npy"}
    results = client.get(f"{url}/results", headers=npy)
    vectors = np.load(io.BytesIO(results.data), allow_pickle=False)
    assert vectors.shape == (len(texts), 384)
    for start in range(0, len(texts), len(SENTENCES)):
        assert_reference(vectors[start : start + len(SENTENCES)])
