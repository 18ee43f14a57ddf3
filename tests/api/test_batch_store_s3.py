"""Batch data in a file store on S3, on real parts: an S3-protocol server on loopback
(moto's, standing in for S3: real S3 is not tested), an API app and a Celery worker
process of their own, both naming `s3://<bucket>/<prefix>` with FILE_STORE_OPTIONS
as production would. Uploads and results are objects in the bucket, not rows in
PostgreSQL; results equal direct ONNX Runtime and the same batch's on the local store;
an app and a worker started afresh read what was uploaded before them."""

from __future__ import annotations

import io
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app.batches.tables import Batch, File, FilePart
from app.jobs.chunks import file_key, result_key
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.api.test_batch_store import chunks_of
from tests.api.test_batches import direct, npy_bytes, npy_results, rows, submit, upload, wait_batch
from tests.conftest import RUN_ID, TenantAuth, WorkerProcess
from tests.s3 import BLOCK, S3
from tests.support import starts_processes

PARQUET = "application/vnd.apache.parquet"
MODEL = "digits-s3"  # the digits model under a name only this module's worker is woken for
CHUNK_ROWS = 4096
PIXELS = rows(25_000)  # 6.4 MB of .npy, past a block: uploaded as a multipart upload
PREFIX = f"store-{RUN_ID}"


@pytest.fixture(scope="module")
def s3_settings(settings: Settings, s3: S3, model_repository: Path) -> Settings:
    """The run's settings on the S3 store, with a queue of their own (the run's other
    workers read the local store)."""
    own = model_repository / MODEL
    if not own.exists():
        shutil.copytree(model_repository / "digits", own)
    return settings.with_overrides(
        jobs_queue=f"{settings.jobs_queue}-s3",
        file_store_url=s3.url(PREFIX),
        file_store_options=s3.options_json,
        batch_chunk_rows=CHUNK_ROWS,
    )


class Worker:
    """The S3 store's worker process, which a test may replace by a new one."""

    def __init__(self, start: Callable[[], WorkerProcess]) -> None:
        self._start = start
        self.process = start()

    def restart(self) -> None:
        self.process.stop()
        self.process = self._start()


@pytest.fixture(scope="module")
@starts_processes
def s3_worker(
    s3_settings: Settings, s3: S3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    folder = tmp_path_factory.mktemp("s3-worker")

    def start() -> WorkerProcess:
        return WorkerProcess(
            s3_settings, folder / f"worker-{uuid.uuid4().hex[:6]}.log",
            FILE_STORE_URL=s3.url(PREFIX), FILE_STORE_OPTIONS=s3.options_json,
            DRAIN_LINGER_MS="0",
        )  # fmt: skip

    worker = Worker(start)
    yield worker
    worker.process.stop()


def results_of(client: FlaskClient, auth: dict[str, str], batch_id: str) -> dict[str, Any]:
    """The batch's results as .npy and as Parquet, both as arrays."""
    npy = npy_results(client, auth, batch_id)
    response = client.get(f"/batches/{batch_id}/results", headers={**auth, "Accept": PARQUET})
    assert response.status_code == 200 and response.mimetype == PARQUET, response.data[:500]
    table = pq.read_table(io.BytesIO(response.data))
    return {
        "label": npy["label"],
        "probabilities": npy["probabilities"],
        "parquet_label": table.column("label").to_numpy(),
        "parquet_probabilities": np.stack(
            table.column("probabilities").to_numpy(zero_copy_only=False)
        ),
    }


def assert_same(got: dict[str, Any], expected: dict[str, np.ndarray]) -> None:
    for name in ("label", "probabilities"):
        assert np.array_equal(got[name], expected[name]), name
        assert np.array_equal(got[f"parquet_{name}"], expected[name]), f"parquet {name}"


def test_uploads_and_results_are_objects_in_the_bucket_equal_to_direct_ort_and_the_local_store(
    make_app: Callable[..., Flask],
    s3_settings: Settings,
    s3: S3,
    s3_worker: Worker,
    worker: WorkerProcess,
    database: Database,
    tenant: TenantAuth,
    model_repository: Path,
) -> None:
    app = make_app(s3_settings)
    client, auth = app.test_client(), tenant.headers
    data = npy_bytes(PIXELS)
    file_id = upload(client, auth, data, "pixels.npy")
    key = file_key(tenant.id, uuid.UUID(file_id))
    assert s3.objects(PREFIX)[key] == len(data) > BLOCK
    stored = s3.client.get_object(Bucket=s3.bucket, Key=f"{PREFIX}/{key}")
    assert stored["ETag"].endswith('-2"')  # a multipart upload's object, of two parts
    assert stored["Body"].read() == data
    with database.sessionmaker() as session:
        file = session.get(File, uuid.UUID(file_id))
        assert file is not None and file.store_key == key
        assert session.scalar(sa.select(sa.func.count()).select_from(FilePart)
                              .where(FilePart.file_id == file.id)) == 0  # fmt: skip

    batch = submit(client, auth, model=MODEL, file_id=file_id)
    done = wait_batch(client, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == len(PIXELS), done
    batch_id = uuid.UUID(batch["id"])
    chunks = chunks_of(database, batch_id)
    assert [c.batch_index for c in chunks] == list(range(7))  # chunks of 4096 rows
    assert all(c.no_data and c.input_key == key for c in chunks)  # rows read in place
    objects = s3.objects(PREFIX)
    parts = {k: size for k, size in objects.items() if k.startswith(f"batches/{batch_id}/")}
    assert parts == {result_key(batch_id, c.batch_index): c.output_bytes for c in chunks}
    assert s3.unfinished_uploads(PREFIX) == []

    expected = direct(model_repository / "digits" / "1", PIXELS)
    got = results_of(client, auth, batch["id"])
    assert_same(got, expected)

    local = make_app(batch_chunk_rows=CHUNK_ROWS).test_client()  # the run's own store and worker
    assert container_of(local.application).parts.store.root != container_of(app).parts.store.root
    local_file = upload(local, auth, data, "pixels.npy")
    local_batch = submit(local, auth, model="digits", file_id=local_file)
    assert wait_batch(local, auth, local_batch["id"])["status"] == "succeeded"
    on_disk = results_of(local, auth, local_batch["id"])
    for name, array in got.items():
        assert np.array_equal(array, on_disk[name]), name
    assert not any(k.endswith(local_file) for k in s3.objects(PREFIX))

    assert client.delete(f"/files/{file_id}", headers=auth).status_code == 204
    assert key not in s3.objects(PREFIX)  # the object went with its file
    with database.sessionmaker() as session:  # retention: finished long ago
        session.execute(sa.update(Batch).where(Batch.id == batch_id)
                        .values(finished_at=sa.text("now() - interval '2 days'")))  # fmt: skip
        session.commit()
    with container_of(app).scope():
        assert container_of(app).worker.maintenance.purge_batch_objects(86_400) >= 1
    assert not any(k.startswith(f"batches/{batch_id}/") for k in s3.objects(PREFIX))
    gone = client.get(
        f"/batches/{batch_id}/results", headers={**auth, "Accept": "application/x-npy"}
    )
    assert gone.status_code == 409 and "retention" in gone.json["detail"]


def test_an_upload_over_the_limit_leaves_no_object_and_no_unfinished_upload(
    make_app: Callable[..., Flask], s3_settings: Settings, s3: S3, tenant: TenantAuth
) -> None:
    client = make_app(s3_settings, max_upload_bytes=BLOCK + 512 * 1024).test_client()
    before = s3.objects(PREFIX)
    response = client.post(  # sent chunked, of no announced length: cut off mid-upload
        "/files?filename=big.npy", input_stream=io.BytesIO(npy_bytes(PIXELS)),
        headers={**tenant.headers, "Transfer-Encoding": "chunked"},
        content_type="application/octet-stream", environ_overrides={"wsgi.input_terminated": True},
    )  # fmt: skip
    assert response.status_code == 413, response.json
    assert s3.objects(PREFIX) == before and s3.unfinished_uploads(PREFIX) == []


def test_an_app_and_a_worker_started_afresh_read_an_upload_made_before_them(
    make_app: Callable[..., Flask],
    s3_settings: Settings,
    s3_worker: Worker,
    tenant: TenantAuth,
    model_repository: Path,
) -> None:
    pixels = PIXELS[:5_000]
    first = make_app(s3_settings)
    file_id = upload(first.test_client(), tenant.headers, npy_bytes(pixels), "pixels.npy")
    # Nothing of the first app or worker outlives them: not even the S3 clients
    # s3fs keeps per process.
    type(container_of(first).parts.store.fs).clear_instance_cache()
    s3_worker.restart()
    second = make_app(s3_settings)
    assert container_of(second).parts.store.fs is not container_of(first).parts.store.fs
    client = second.test_client()
    batch = submit(client, tenant.headers, model=MODEL, file_id=file_id)
    done = wait_batch(client, tenant.headers, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == len(pixels), done
    assert_same(
        results_of(client, tenant.headers, batch["id"]),
        direct(model_repository / "digits" / "1", pixels),
    )
