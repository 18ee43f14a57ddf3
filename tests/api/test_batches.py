"""The batch door on real parts: files uploaded into PostgreSQL, batches cut into
chunk jobs that real Celery workers run, results streamed in input order."""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.batches.creation import Chunking, attach_file, new_batch
from app.cards import ModelCard
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.sessions import SessionPool
from app.web.context import container_of
from app.webhooks.payloads import render
from app.webhooks.tables import WebhookDelivery
from tests.conftest import TenantAuth, WorkerProcess
from tests.models import build_flaky_digits, build_slow_rows
from tests.support import wait_until

RNG = np.random.default_rng(11)
NPY = "application/x-npy"


def rows(n: int) -> np.ndarray:
    return (RNG.random((n, 64)) * 16).astype(np.float32)


def direct(model_dir: Path, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the same file: the reference."""
    return SessionPool("cpu").run(ModelCard.load(model_dir), {"pixels": pixels})


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


@pytest.fixture(scope="module")
def batch_app(settings: Settings, model_repository: Path) -> Flask:
    """The test run's app, its repository holding the batch tests' models."""
    build_flaky_digits(model_repository, model_repository / "digits" / "1")
    build_slow_rows(model_repository)
    small = model_repository / "digits-small" / "1"
    if not small.exists():
        shutil.copytree(model_repository / "digits" / "1", small)
        card = json.loads((small / "card.json").read_text())
        (small / "card.json").write_text(json.dumps({**card, "batch_chunk_rows": 16}))
    limits = {
        "max_upload_bytes": 64 * 1024 * 1024,
        "webhook_allow_private_networks": True,
        "batch_chunk_rows": 4096,
    }  # several chunks in batches of thousands of rows
    return create_app(settings.with_overrides(**limits))


@pytest.fixture
def bclient(batch_app: Flask) -> FlaskClient:
    return batch_app.test_client()


def upload(client: FlaskClient, auth: dict[str, str], data: bytes, filename: str) -> str:
    response = client.post(
        f"/files?filename={filename}", data=data, headers=auth,
        content_type="application/octet-stream",
    )  # fmt: skip
    assert response.status_code == 201, response.json
    assert response.json["size_bytes"] == len(data)
    return str(response.json["id"])


def submit(client: FlaskClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    response = client.post("/batches", json=body, headers=auth)
    assert response.status_code == 202, response.json
    assert response.headers["Location"] == f"/batches/{response.json['id']}"
    result: dict[str, Any] = response.json
    return result


def wait_batch(
    client: FlaskClient,
    auth: dict[str, str],
    batch_id: str,
    timeout: float = 120,
    database: Database | None = None,
) -> dict[str, Any]:
    """Poll until finished; with `database`, run the sweep's wake-ups as beat
    would (a chunk back from a retry's backoff waits for them)."""
    seen: dict[str, Any] = {}

    def finished() -> dict[str, Any] | None:
        batch: dict[str, Any] = client.get(f"/batches/{batch_id}", headers=auth).json
        if batch["status"] not in ("queued", "running"):
            return batch
        seen.update(batch)
        if database is not None:
            container = container_of(client.application)
            with container.scope():
                container.worker.maintenance.wake_waiting(60)
        return None

    return wait_until(finished, lambda: f"batch still {seen['status']}: {seen}", timeout)


def npy_results(client: FlaskClient, auth: dict[str, str], batch_id: str, **query: str) -> Any:
    response = client.get(
        f"/batches/{batch_id}/results", headers={**auth, "Accept": NPY}, query_string=query
    )
    assert response.status_code == 200, response.data[:500]
    assert response.mimetype == NPY
    return np.load(io.BytesIO(response.data), allow_pickle=False)


def jsonl_results(client: FlaskClient, auth: dict[str, str], batch_id: str) -> list[Any]:
    response = client.get(f"/batches/{batch_id}/results", headers=auth)
    assert response.status_code == 200, response.data[:500]
    return [json.loads(line) for line in response.data.decode().splitlines()]


def test_file_batch_of_100000_rows_equals_direct_ort_with_a_chunk_failing_once(
    bclient: FlaskClient,
    auth: dict[str, str],
    worker: WorkerProcess,
    database: Database,
    model_repository: Path,
) -> None:
    pixels = rows(100_000)
    pixels[10_000, 5] = 17.0  # chunk 2 (rows 8192-12287) fails to allocate on the flaky model
    file_id = upload(bclient, auth, npy_bytes(pixels), "pixels.npy")
    batch = submit(bclient, auth, model="digits-flaky", file_id=file_id)
    assert batch["status"] == "queued" and batch["file_id"] == file_id

    flaky = model_repository / "digits-flaky" / "1"
    seen: list[Any] = [None]

    def chunk_failed() -> bool:  # the first attempt fails; then a person deploys the fixed model
        with database.sessionmaker() as session:
            chunk = session.scalar(
                sa.select(Job).where(Job.batch_id == uuid.UUID(batch["id"]), Job.batch_index == 2)
            )
        seen[0] = chunk and (chunk.status, chunk.error_code, chunk.error_message)
        return chunk is not None and chunk.error_code == "resource_exhausted"

    wait_until(
        chunk_failed, lambda: f"chunk 2 to fail for lack of memory: {seen[0]}", 120, interval=0.02
    )
    fixed = flaky / "model.onnx.fixed"
    shutil.copy(model_repository / "digits" / "1" / "model.onnx", fixed)
    os.replace(fixed, flaky / "model.onnx")

    done = wait_batch(bclient, auth, batch["id"], database=database)
    assert done["status"] == "succeeded", done
    assert done["rows"] == done["rows_done"] == 100_000
    assert done["rows_failed"] == 0 and done["failed_rows"] == []
    assert done["chunks"] == {"succeeded": 25}
    with database.sessionmaker() as session:
        attempts = session.scalar(
            sa.select(Job.attempts).where(
                Job.batch_id == uuid.UUID(batch["id"]), Job.batch_index == 2
            )
        )
    assert attempts is not None and attempts >= 2

    expected = direct(model_repository / "digits" / "1", pixels)
    results = npy_results(bclient, auth, batch["id"])
    assert results.shape == (100_000,)
    assert np.array_equal(results["label"], expected["label"])
    assert np.array_equal(results["probabilities"], expected["probabilities"])
    single = npy_results(bclient, auth, batch["id"], output="probabilities")
    assert single.shape == (100_000, 10) and np.array_equal(single, expected["probabilities"])
    lines = jsonl_results(bclient, auth, batch["id"])
    assert [line["row"] for line in lines] == list(range(100_000))
    for i in (0, 8192, 10_000, 99_999):
        assert lines[i]["outputs"]["label"] == int(expected["label"][i])
        assert np.array_equal(
            np.asarray(lines[i]["outputs"]["probabilities"], np.float32),
            expected["probabilities"][i],
        )
    listed = bclient.get("/jobs?limit=200", headers=auth).json["items"]
    assert all(job["model"] != "digits-flaky" for job in listed)  # chunks are not jobs to list


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "inline"])
def test_jsonl_csv_and_inline_rows_give_the_same_results(
    bclient: FlaskClient,
    auth: dict[str, str],
    worker: WorkerProcess,
    model_repository: Path,
    fmt: str,
) -> None:
    pixels = rows(50)
    if fmt == "inline":
        batch = submit(bclient, auth, model="digits-small", inputs={"pixels": pixels.tolist()})
        assert batch["status"] == "running" and batch["rows"] == 50
    else:
        if fmt == "jsonl":
            text = "".join(json.dumps({"pixels": row.tolist()}) + "\n" for row in pixels)
        else:
            header = ",".join(f"p{i}" for i in range(64)) + "\n"
            text = header + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in pixels)
        file_id = upload(bclient, auth, text.encode(), f"rows.{fmt}")
        batch = submit(bclient, auth, model="digits-small", file_id=file_id)
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 50
    assert done["chunks"] == {"succeeded": 4}  # 16 rows a chunk
    expected = direct(model_repository / "digits" / "1", pixels)
    results = npy_results(bclient, auth, batch["id"], output="label")
    assert np.array_equal(results, expected["label"])


def test_a_chunk_that_keeps_failing_is_dead_lettered_and_the_batch_says_which_rows(
    bclient: FlaskClient, auth: dict[str, str], worker: WorkerProcess, database: Database
) -> None:
    pixels = rows(48)
    pixels[20] = 3e38  # the model's softmax gives NaN: rows 16-31 (chunk 1) cannot succeed
    batch = submit(bclient, auth, model="digits-small", inputs={"pixels": pixels.tolist()})
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "partially_succeeded", done
    assert (done["rows_done"], done["rows_failed"]) == (32, 16)
    assert done["chunks"] == {"succeeded": 2, "failed": 1}
    assert done["failed_rows"] == [
        {"first": 16, "last": 31, "status": "failed", "error": "non_finite_output"}
    ]
    lines = jsonl_results(bclient, auth, batch["id"])
    assert [("error" in line) for line in lines] == [False] * 16 + [True] * 16 + [False] * 16
    assert lines[20]["error"]["code"] == "non_finite_output"
    npy = bclient.get(f"/batches/{batch['id']}/results", headers={**auth, "Accept": NPY})
    assert npy.status_code == 409 and "16 rows" in npy.json["detail"]
    with database.sessionmaker() as session:  # the chunk is a dead letter, like any job
        letters = session.execute(
            sa.text("SELECT d.error_code FROM dead_letters d JOIN jobs j ON j.id = d.job_id "
                    "WHERE j.batch_id = :id"), {"id": batch["id"]},
        ).scalars().all()  # fmt: skip
    assert letters == ["non_finite_output"]


def test_npy_rows_read_in_place_are_checked_by_the_worker_chunk_by_chunk(
    bclient: FlaskClient, auth: dict[str, str], worker: WorkerProcess, database: Database
) -> None:
    pixels = rows(40)
    pixels[21, 3] = np.nan  # past the rows checked at submit
    file_id = upload(bclient, auth, npy_bytes(pixels), "nan.npy")
    batch = submit(bclient, auth, model="digits-small", file_id=file_id)
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "partially_succeeded", done
    assert done["failed_rows"] == [
        {"first": 16, "last": 31, "status": "failed", "error": "invalid_input"}
    ]
    with database.sessionmaker() as session:  # the rows stayed in the file: nothing copied
        chunks = session.execute(
            sa.select(Job.input_file_id, Job.input_offset).where(
                Job.batch_id == uuid.UUID(batch["id"])
            ).order_by(Job.batch_index)
        ).all()  # fmt: skip
    header = len(npy_bytes(pixels)) - pixels.nbytes
    assert [(str(f), o) for f, o in chunks] == [
        (file_id, header + first * 64 * 4) for first in (0, 16, 32)
    ]
    assert bclient.delete(f"/files/{file_id}", headers=auth).status_code == 204  # finished


def test_a_bad_row_past_the_first_fails_the_batch_naming_it(
    bclient: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    lines = [json.dumps({"pixels": row.tolist()}) for row in rows(40)]
    lines[33] = json.dumps({"pixels": [1.0] * 63})
    file_id = upload(bclient, auth, "\n".join(lines).encode(), "rows.jsonl")
    batch = submit(bclient, auth, model="digits-small", file_id=file_id)
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == "invalid_input"
    assert "row 32" in done["error"]["message"]  # the chunk of rows 32-47 holds it
    assert "pixels" in done["error"]["message"]
    lines = jsonl_results(bclient, auth, batch["id"])  # the chunks cut before it ran
    assert [line["row"] for line in lines] == list(range(32))


def test_cancel_halfway_stops_queued_chunks_and_keeps_finished_ones(
    bclient: FlaskClient, auth: dict[str, str], worker: WorkerProcess, database: Database
) -> None:
    x = (RNG.random((400, 64)) - 0.5).astype(np.float32)  # 50 chunks of 8 rows, ~40 ms each
    batch = submit(bclient, auth, model="slow-rows", inputs={"x": x.tolist()})
    wait_until(
        lambda: bclient.get(f"/batches/{batch['id']}", headers=auth).json["rows_done"] > 0,
        "the first rows done",
        60,
        interval=0.02,
    )
    response = bclient.post(f"/batches/{batch['id']}/cancel", headers=auth)
    assert response.status_code == 200, response.json
    assert response.json["cancel_requested_at"] is not None
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "cancelled"
    assert 0 < done["rows_done"] < 400
    assert done["rows_done"] + done["rows_failed"] == 400 and done["rows_pending"] == 0
    assert done["chunks"].get("cancelled", 0) > 0
    assert all(r["status"] == "cancelled" for r in done["failed_rows"])
    with database.sessionmaker() as session:  # nothing runs after the batch finished
        open_chunks = session.scalar(
            sa.select(sa.func.count()).where(
                Job.batch_id == uuid.UUID(batch["id"]), Job.status.in_(["queued", "running"])
            )
        )
    assert open_chunks == 0
    lines = jsonl_results(bclient, auth, batch["id"])
    assert len(lines) == 400
    assert sum("outputs" in line for line in lines) == done["rows_done"]
    assert {line["error"]["code"] for line in lines if "error" in line} == {"cancelled"}
    npy = bclient.get(f"/batches/{batch['id']}/results", headers={**auth, "Accept": NPY})
    assert npy.status_code == 409 and "JSONL" in npy.json["detail"]
    again = bclient.post(f"/batches/{batch['id']}/cancel", headers=auth)
    assert again.status_code == 409


def test_batch_webhook_fires_once_per_batch_not_per_chunk(
    bclient: FlaskClient, auth: dict[str, str], worker: WorkerProcess, database: Database,
    batch_app: Flask,
) -> None:  # fmt: skip
    batch = submit(
        bclient, auth, model="digits-small", inputs={"pixels": rows(40).tolist()},
        webhook={"url": "http://127.0.0.1:9/hook"},
    )  # fmt: skip
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "succeeded"
    with database.sessionmaker() as session:
        deliveries = list(
            session.scalars(
                sa.select(WebhookDelivery).where(WebhookDelivery.batch_id == uuid.UUID(batch["id"]))
            )
        )
        assert [d.event_type for d in deliveries] == ["batch.succeeded"]
        chunk_deliveries = session.scalar(
            sa.select(sa.func.count())
            .select_from(WebhookDelivery)
            .join(Job, Job.id == WebhookDelivery.job_id)
            .where(Job.batch_id == uuid.UUID(batch["id"]))
        )
        assert chunk_deliveries == 0
        max_bytes = container_of(batch_app).settings.webhook_max_payload_bytes
        body = json.loads(render(session, deliveries[0], deliveries[0].created_at, max_bytes))
    assert body["type"] == "batch.succeeded"
    assert body["data"]["id"] == batch["id"] and body["data"]["rows_done"] == 40


def test_bad_requests_are_clear_problems(
    bclient: FlaskClient, auth: dict[str, str], make_other: TenantAuth
) -> None:
    def problem(response: Any, status: int) -> dict[str, Any]:
        assert response.status_code == status, response.json
        assert response.mimetype == "application/problem+json"
        body: dict[str, Any] = response.json
        return body

    wrong_shape = upload(bclient, auth, npy_bytes(rows(10)[:, :60].copy()), "narrow.npy")
    body = problem(bclient.post("/batches", json={"model": "digits", "file_id": wrong_shape},
                                headers=auth), 422)  # fmt: skip
    assert "64" in body["detail"] and body["expected"][0]["name"] == "pixels"
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    pickle_id = upload(bclient, auth, pickled.getvalue(), "objects.npy")
    body = problem(bclient.post("/batches", json={"model": "digits", "file_id": pickle_id},
                                headers=auth), 422)  # fmt: skip
    assert "pickle" in body["detail"]
    body = problem(bclient.post("/batches", json={"model": "digits"}, headers=auth), 422)
    assert "inputs" in body["detail"] and "file_id" in body["detail"]
    problem(bclient.post("/batches", json={"model": "slow", "inputs": {}}, headers=auth), 422)
    problem(bclient.post("/batches", json={"model": "digits", "inputs": {"pixels": [[1.0]]}},
                         headers=auth), 422)  # fmt: skip
    problem(bclient.post("/batches", json={"model": "digits", "file_id": str(uuid.uuid4())},
                         headers=auth), 404)  # fmt: skip
    problem(bclient.post("/batches", json={"model": "nope", "inputs": {}}, headers=auth), 404)
    body = problem(bclient.post("/files?filename=rows.xlsx", data=b"x", headers=auth), 422)
    assert "npy" in body["detail"] and "parquet" in body["detail"]
    problem(bclient.post("/files?filename=rows.npy", data=b"", headers=auth), 422)
    too_big = b"0" * (64 * 1024 * 1024 + 1)
    body = problem(bclient.post("/files?filename=big.csv", data=too_big, headers=auth), 413)
    assert "MAX_UPLOAD_BYTES" in body["detail"]
    problem(bclient.post("/files?filename=rows.npy", data=b"x"), 401)
    problem(bclient.post("/batches", data=b"{not json", content_type="application/json"), 401)

    mine = submit(bclient, auth, model="digits-small", inputs={"pixels": rows(3).tolist()})
    other = make_other.headers
    problem(bclient.get(f"/batches/{mine['id']}", headers=other), 404)
    problem(bclient.get(f"/batches/{mine['id']}/results", headers=other), 404)
    problem(bclient.post(f"/batches/{mine['id']}/cancel", headers=other), 404)
    problem(bclient.get(f"/files/{wrong_shape}", headers=other), 404)
    assert bclient.get("/batches", headers=other).json["items"] == []


def test_results_of_an_unfinished_batch_are_a_409(
    bclient: FlaskClient, auth: dict[str, str], database: Database
) -> None:
    file_id = upload(bclient, auth, npy_bytes(rows(10)), "r.npy")
    app = bclient.application
    container = container_of(app)
    card = container.parts.repository.resolve("digits")
    batch = new_batch(card, Chunking.of(container.settings), make_tenant_id(auth, database))
    with database.sessionmaker.begin() as session:  # no split: it stays queued
        attach_file(session, container.parts.store, batch, card, uuid.UUID(file_id))
        session.add(batch)
    response = bclient.get(f"/batches/{batch.id}/results", headers=auth)
    assert response.status_code == 409 and "queued" in response.json["detail"]
    deleted = bclient.delete(f"/files/{file_id}", headers=auth)
    assert deleted.status_code == 409  # the batch still reads it
    bclient.post(f"/batches/{batch.id}/cancel", headers=auth)
    assert bclient.delete(f"/files/{file_id}", headers=auth).status_code == 204


def make_tenant_id(auth: dict[str, str], database: Database) -> int:
    from app.tenancy.keys import KeyCache

    with database.sessionmaker() as session:
        tenant = KeyCache(0).lookup(session, auth["Authorization"].split()[1])
        assert tenant is not None
        return tenant.id


@pytest.fixture
def make_other(database: Database) -> Iterator[TenantAuth]:
    from tests.conftest import make_tenant

    yield make_tenant(database)
