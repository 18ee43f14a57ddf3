"""A chunk whose result part cannot be written (a full or broken file store, an S3
endpoint that does not answer) is tried again later, like any transient failure,
and never counted as done; once the store answers, the same chunk succeeds and its
part is read back whole. An upload the store cannot take is refused, naming why,
and leaves no file."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from flask import Flask
from fsspec.implementations.local import LocalFileOpener

from app.jobs.chunks import result_key
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.filestore import FileStore
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import TenantAuth, load_job
from tests.support import execute, free_port

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
    good = container_of(app).parts.runner
    [failed] = execute(container_of(app), [chunk], replace(good, store=broken))
    assert failed.status == "retry" and failed.error_code == "store_unavailable"
    job = load_job(database, chunk)
    assert job.status == "queued" and job.attempts == 1 and job.output_bytes is None
    assert good.store.size(result_key(batch_id, 0)) is None  # nothing taken as done

    with database.engine.begin() as conn:  # its backoff over
        conn.execute(sa.text("UPDATE jobs SET run_after = now() WHERE id = :id"), {"id": chunk})
    [done] = execute(container_of(app), [chunk])
    assert done.status == "succeeded"
    finished = client.get(f"/batches/{batch_id}", headers=tenant.headers).json
    assert finished["status"] == "succeeded" and finished["rows_done"] == len(ROWS)
    lines = client.get(f"/batches/{batch_id}/results", headers=tenant.headers).data.splitlines()
    assert len(lines) == len(ROWS)


def test_an_upload_the_store_cannot_take_is_refused_naming_why_and_leaves_no_file(
    make_app: Callable[..., Flask],
    tenant: TenantAuth,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full store (the disk fills after the upload's first MiB) is a 507, any other
    failure of it (a file where it wants its folder) a 503, both problem+json with
    Retry-After; neither leaves an object, a temporary file or a listed file."""
    root = tmp_path / "store"
    client = make_app(file_store_url=str(root)).test_client()
    line = b'{"pixels": [' + b", ".join([b"1.0"] * 64) + b"]}\n"
    data = line * (3 * 1024 * 1024 // len(line))
    real_write, written = LocalFileOpener.write, []

    def write_until_full(self: LocalFileOpener, part: bytes) -> int:
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        written.append(len(part))
        return int(real_write(self, part))

    def post() -> Any:
        return client.post("/files?filename=rows.jsonl", data=data, headers=tenant.headers,
                           content_type="application/octet-stream")  # fmt: skip

    def nothing_kept() -> None:
        assert client.get("/files", headers=tenant.headers).json["items"] == []
        assert [p for p in root.rglob("*") if p.is_file()] == []

    monkeypatch.setattr(LocalFileOpener, "write", write_until_full)
    full = post()
    monkeypatch.undo()
    assert written and full.status_code == 507, full.json
    assert full.mimetype == "application/problem+json"
    assert full.json["type"] == "/problems/insufficient-storage"
    assert "file store is full" in full.json["detail"] and int(full.headers["Retry-After"]) > 0
    nothing_kept()

    shutil.rmtree(root / "files")
    (root / "files").write_text("a file where the store wants a folder")
    broken = post()
    assert broken.status_code == 503 and broken.mimetype == "application/problem+json"
    assert "file store failed" in broken.json["detail"], broken.json
    assert int(broken.headers["Retry-After"]) > 0
    assert client.get("/files", headers=tenant.headers).json["items"] == []

    (root / "files").unlink()
    stored = post()
    assert stored.status_code == 201 and stored.json["size_bytes"] == len(data), stored.json
