"""A chunk whose result part cannot be written (a full or broken file store, an S3
endpoint that does not answer) is tried again later, like any transient failure,
and never counted as done; once the store answers, the same chunk succeeds and its
part is read back whole."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from flask import Flask

from app.jobs import runner
from app.jobs.chunks import result_key
from app.platform.database import Database
from app.platform.filestore import FileStore
from app.platform.settings import Settings
from app.platform.tables import Job
from app.web.context import container_of
from tests.conftest import TenantAuth, free_port, load_job

ROWS = (np.random.default_rng(3).random((6, 64)) * 16).astype(np.float32)


def broken_store(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> FileStore:
    if where == "s3":  # the test bucket's server, at a port where nothing listens
        s3 = request.getfixturevalue("s3")
        gone = {"endpoint_url": f"http://127.0.0.1:{free_port()}",
                "config_kwargs": {"retries": {"total_max_attempts": 1}}}  # fmt: skip
        return FileStore(s3.url("gone"), {**s3.options, **gone})
    broken = tmp_path / "store"
    broken.mkdir()
    (broken / "batches").write_text("a file where the store wants a folder")
    return FileStore(str(broken))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_chunk_whose_part_cannot_be_written_is_retried_then_succeeds(
    make_app: Callable[..., Flask],
    settings: Settings,
    database: Database,
    tenant: TenantAuth,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    # A queue no worker reads: the chunks wait for this test to run them.
    app = make_app(jobs_queue=f"{settings.jobs_queue}-idle-{uuid.uuid4().hex[:6]}")
    client = app.test_client()
    answer = client.post(
        "/batches", json={"model": "digits", "inputs": {"pixels": ROWS.tolist()}},
        headers=tenant.headers,
    )  # fmt: skip
    assert answer.status_code == 202, answer.json
    batch_id = uuid.UUID(answer.json["id"])
    with database.sessionmaker() as session:
        [chunk] = session.scalars(sa.select(Job.id).where(Job.batch_id == batch_id)).all()

    broken = broken_store(where, tmp_path, request)
    good = container_of(app).runtime
    with app.app_context(), database.sessionmaker() as session:
        [failed] = runner.execute(session, replace(good, store=broken), [chunk])
    assert failed.status == "retry" and failed.error_code == "store_unavailable"
    job = load_job(database, chunk)
    assert job.status == "queued" and job.attempts == 1 and job.output_bytes is None
    assert good.store.size(result_key(batch_id, 0)) is None  # nothing taken as done

    with database.engine.begin() as conn:  # its backoff over
        conn.execute(sa.text("UPDATE jobs SET run_after = now() WHERE id = :id"), {"id": chunk})
    with app.app_context(), database.sessionmaker() as session:
        [done] = runner.execute(session, good, [chunk])
    assert done.status == "succeeded"
    finished = client.get(f"/batches/{batch_id}", headers=tenant.headers).json
    assert finished["status"] == "succeeded" and finished["rows_done"] == len(ROWS)
    lines = client.get(f"/batches/{batch_id}/results", headers=tenant.headers).data.splitlines()
    assert len(lines) == len(ROWS)
