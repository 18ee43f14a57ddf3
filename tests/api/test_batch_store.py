"""Batch data in the file store, on real parts: uploads and results are objects
(PostgreSQL keeps metadata), Parquet in and out, and data written before the
store still read from PostgreSQL."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from app.batches.tables import Batch, File, FilePart
from app.jobs.chunks import PART_BYTES, result_key
from app.jobs.tables import Job
from app.platform.database import Database
from app.web.context import container_of
from tests.api import test_batches
from tests.api.test_batches import (
    direct,
    make_tenant_id,
    npy_bytes,
    npy_results,
    rows,
    submit,
    upload,
    wait_batch,
)
from tests.conftest import WorkerProcess

PARQUET = "application/vnd.apache.parquet"
batch_app, bclient = test_batches.batch_app, test_batches.bclient  # the batch tests' fixtures


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.json
    assert response.mimetype == "application/problem+json"
    body: dict[str, Any] = response.json
    return body


def parquet_bytes(table: pa.Table, row_group_size: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=row_group_size)
    return out.getvalue()


def chunks_of(database: Database, batch_id: uuid.UUID) -> list[Any]:
    """The batch's chunk jobs in order: index, result size, input key, and whether
    their outputs are out of PostgreSQL (`no_data`)."""
    with database.sessionmaker() as session:
        return list(session.execute(
            sa.select(Job.batch_index, Job.output_bytes, Job.input_key,
                      Job.output_data.is_(None).label("no_data"))
            .where(Job.batch_id == batch_id).order_by(Job.batch_index)
        ))  # fmt: skip


def pixels_column(pixels: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), pixels.shape[1])


def test_uploads_and_results_are_objects_in_the_store_not_rows_in_postgresql(
    bclient: FlaskClient,
    auth: dict[str, str],
    worker: WorkerProcess,
    database: Database,
    model_repository: Path,
) -> None:
    store = container_of(bclient.application).parts.store
    pixels = rows(10_000)
    data = npy_bytes(pixels)
    file_id = upload(bclient, auth, data, "pixels.npy")
    with database.sessionmaker() as session:
        file = session.get(File, uuid.UUID(file_id))
        assert file is not None and file.store_key is not None
        assert str(file_id) in file.store_key and "pixels" not in file.store_key
        assert session.scalar(sa.select(sa.func.count()).select_from(FilePart)
                              .where(FilePart.file_id == file.id)) == 0  # fmt: skip
        key = file.store_key
    assert store.read(key) == data

    batch = submit(bclient, auth, model="digits", file_id=file_id)
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 10_000
    batch_id = uuid.UUID(batch["id"])
    chunks = chunks_of(database, batch_id)
    with database.sessionmaker() as session:
        result_bytes = session.scalar(sa.select(Batch.result_bytes).where(Batch.id == batch_id))
    assert [c.batch_index for c in chunks] == [0, 1, 2]  # chunks of 4096 rows
    assert all(c.no_data and c.input_key == key for c in chunks)
    sizes = [store.size(result_key(batch_id, c.batch_index)) for c in chunks]
    assert sizes == [c.output_bytes for c in chunks] and result_bytes == sum(sizes)  # quota

    expected = direct(model_repository / "digits" / "1", pixels)
    results = npy_results(bclient, auth, batch["id"])
    assert np.array_equal(results["label"], expected["label"])
    assert np.array_equal(results["probabilities"], expected["probabilities"])

    assert bclient.delete(f"/files/{file_id}", headers=auth).status_code == 204
    assert store.size(key) is None  # the object went with its file

    with database.sessionmaker() as session:  # retention: finished long ago
        session.execute(sa.update(Batch).where(Batch.id == batch_id)
                        .values(finished_at=sa.text("now() - interval '2 days'")))  # fmt: skip
        session.commit()
    container = container_of(bclient.application)
    with container.scope():
        assert container.worker.maintenance.purge_batch_objects(86_400) >= 1
    assert store.size(result_key(batch_id, 0)) is None
    gone = bclient.get(
        f"/batches/{batch_id}/results", headers={**auth, "Accept": "application/x-npy"}
    )
    assert gone.status_code == 409 and "retention" in gone.json["detail"]


def test_parquet_in_and_parquet_out_equal_direct_ort(
    bclient: FlaskClient,
    auth: dict[str, str],
    worker: WorkerProcess,
    model_repository: Path,
) -> None:
    pixels = rows(9_000)
    table = pa.table({"id": pa.array(range(9_000)), "pixels": pixels_column(pixels)})
    file_id = upload(bclient, auth, parquet_bytes(table, 2_000), "rows.parquet")
    batch = submit(bclient, auth, model="digits", file_id=file_id)
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 9_000, done

    response = bclient.get(f"/batches/{batch['id']}/results", headers={**auth, "Accept": PARQUET})
    assert response.status_code == 200 and response.mimetype == PARQUET
    got = pq.ParquetFile(io.BytesIO(response.data))
    assert got.metadata.num_row_groups == 3  # a row group per chunk of 4096 rows
    result = got.read()
    expected = direct(model_repository / "digits" / "1", pixels)
    assert result.column_names == ["label", "probabilities"]
    assert np.array_equal(result.column("label").to_numpy(), expected["label"])
    probabilities = np.stack(result.column("probabilities").to_numpy(zero_copy_only=False))
    assert np.array_equal(probabilities, expected["probabilities"])
    one = bclient.get(f"/batches/{batch['id']}/results?output=label",
                      headers={**auth, "Accept": PARQUET})  # fmt: skip
    assert pq.read_table(io.BytesIO(one.data)).column_names == ["label"]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        (pa.table({"image": pixels_column(rows(5))}), "no column pixels"),
        (pa.table({"pixels": pa.array([[1.0] * 63] * 5)}), "has 63 values in column pixels"),
        (pa.table({"pixels": pa.array(["a"] * 5)}), "column pixels is string"),
        (pa.table({"pixels": pa.array([1.0] * 5)}), "column pixels is double"),
        (None, "not a readable Parquet file"),
    ],
)
def test_bad_parquet_is_a_422_naming_what_was_wrong_and_what_was_expected(
    bclient: FlaskClient, auth: dict[str, str], table: pa.Table | None, says: str
) -> None:
    data = b"PAR1 not really" if table is None else parquet_bytes(table, 100)
    file_id = upload(bclient, auth, data, "bad.parquet")
    response = bclient.post("/batches", json={"model": "digits", "file_id": file_id}, headers=auth)
    body = problem(response, 422)
    assert says in body["detail"], body
    assert body["expected"][0]["name"] == "pixels"


def test_files_and_results_from_before_the_store_are_still_read_from_postgresql(
    bclient: FlaskClient,
    auth: dict[str, str],
    worker: WorkerProcess,
    database: Database,
    model_repository: Path,
) -> None:
    store = container_of(bclient.application).parts.store
    pixels = rows(5_000)
    data = npy_bytes(pixels)
    tenant_id = make_tenant_id(auth, database)
    file_id = uuid.uuid4()
    with database.sessionmaker() as session:  # as an upload was kept before the store
        session.add(File(id=file_id, tenant_id=tenant_id, filename="old.npy", format="npy",
                         size_bytes=len(data), sha256="", parts=0))  # fmt: skip
        session.flush()
        for seq, start in enumerate(range(0, len(data), PART_BYTES)):
            session.add(FilePart(file_id=file_id, seq=seq, data=data[start : start + PART_BYTES]))
        session.commit()
    batch = submit(bclient, auth, model="digits", file_id=str(file_id))
    done = wait_batch(bclient, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 5_000, done
    batch_id = uuid.UUID(batch["id"])
    with database.sessionmaker() as session:  # chunk 0 as a chunk finished before the store
        key = result_key(batch_id, 0)
        session.execute(sa.update(Job).where(Job.batch_id == batch_id, Job.batch_index == 0)
                        .values(output_data=store.read(key), output_bytes=None))  # fmt: skip
        session.commit()
    store.delete(key)
    expected = direct(model_repository / "digits" / "1", pixels)
    results = npy_results(bclient, auth, batch["id"])
    assert np.array_equal(results["probabilities"], expected["probabilities"])
