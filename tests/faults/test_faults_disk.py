"""Full disks: under PostgreSQL (13) and under the file store (14).

Each puts that part's data on a small tmpfs of its own, fills it with a file of
the suite's, drives traffic into the full disk, then deletes the file (space
returns) and tallies what became of every job, as the other scenarios do.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import sqlalchemy as sa
from pgserver.utils import PostmasterInfo

from app.cards import ModelCard
from app.runtime.sessions import SessionPool
from tests.faults.disks import FILLER, disk_stack, fill  # noqa: F401 (a fixture)
from tests.faults.harness import FaultStack
from tests.faults.scenarios import GUARD, check, digits, slow

pytestmark = [pytest.mark.faults, pytest.mark.processes]

PG_MIB = 160  # initdb, the service's database and its migrations take about 60


@dataclass
class Answer:
    status: int | None  # None: no answer at all (the connection failed)
    job_id: str | None
    problem: dict[str, Any] | None
    retry_after: str | None


def post_jobs(stack: FaultStack, bodies: list[dict[str, Any]], clients: int = 4) -> list[Answer]:
    """POST every body; each answer as it came (what `submit` keeps only the 202s of)."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}

    def post(body: dict[str, Any]) -> Answer:
        try:
            r = requests.post(f"{stack.base}/jobs", json=body, headers=headers, timeout=30)
        except requests.RequestException:
            return Answer(None, None, None, None)
        problem = r.json() if r.headers.get("Content-Type") == "application/problem+json" else None
        job_id = str(r.json()["id"]) if r.status_code == 202 else None
        return Answer(r.status_code, job_id, problem, r.headers.get("Retry-After"))

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(post, bodies))


def end_wal_segments(stack: FaultStack, most: int = 8) -> int:
    """End WAL segments, as 16 MiB of traffic does each time, until PostgreSQL
    fails to start the next one (it cannot create the file: it PANICs and drops
    every connection); returns how many ended before that."""
    for ended in range(most):
        try:
            with stack.engine.connect() as conn:
                conn.exec_driver_sql("SELECT pg_logical_emit_message(false, 'faults', 'x')")
                conn.exec_driver_sql("SELECT pg_switch_wal()")
                conn.commit()
                conn.exec_driver_sql("SELECT txid_current()")  # a commit record, flushed
                conn.commit()  # to the next segment
        except sa.exc.DBAPIError:
            return ended
    return most


def postmaster_running(pgdata: Path) -> bool:
    info = PostmasterInfo.read_from_pgdata(pgdata)
    return info is not None and info.is_running()


@GUARD
def test_13_the_disk_under_postgresql_full(
    disk_stack: Callable[..., FaultStack],  # noqa: F811
    guarded: bool,
) -> None:
    """PostgreSQL's data directory on a small disk that fills while two long jobs
    run and clients submit. First the tables cannot grow: a submit that needs a new
    page is refused, 503 problem+json saying the disk is full (one that fits in a
    page's free space is accepted, and kept). Then a WAL segment ends and the next
    cannot be created: PostgreSQL PANICs, and the two long jobs end while it is
    down, so their outcomes are lost with their connections. Once space returns
    (and PostgreSQL is started again, as its supervisor would, where it could not
    recover by itself) every accepted job ends: the long ones taken back by their
    leases. Without the lease guard those two stay `running` for good."""
    stack = disk_stack("" if guarded else "lease", pg_mib=PG_MIB, JOB_MAX_ATTEMPTS="5")
    stack.start_all(concurrency=2)
    before = stack.submit([digits(i) for i in range(100)])
    # The long jobs must end while PostgreSQL is down: two calibration jobs, run as
    # the long ones will be (side by side), say how fast `slow` runs here and now.
    calibration = stack.submit([slow(0.5)] * 2)
    assert stack.wait_terminal(before + calibration, timeout=60) is not None
    with stack.engine.connect() as conn:
        took = conn.execute(
            sa.text("SELECT max(extract(epoch FROM finished_at - started_at)) FROM jobs "
                    "WHERE id::text = ANY(:ids)"), {"ids": calibration},
        ).scalar()  # fmt: skip
    long_s = 2.0
    long_jobs = stack.submit([slow(long_s * 0.5 / float(took))] * 2)
    deadline = time.monotonic() + 30
    while set(stack.statuses(long_jobs).values()) != {"running"}:
        assert time.monotonic() < deadline, stack.statuses(long_jobs)
        time.sleep(0.02)
    started = time.monotonic()
    pgdata = stack.root / "pg"
    filler = fill(pgdata)
    full_at, answers = time.monotonic(), []
    while time.monotonic() - full_at < 0.8:
        answers += post_jobs(stack, [digits(i) for i in range(20)])
    tables_full = len(answers)
    assert set(stack.statuses(long_jobs).values()) == {"running"}
    ended = end_wal_segments(stack)
    while time.monotonic() - started < 3 * long_s:  # well past the long jobs' end
        answers += post_jobs(stack, [digits(0)], clients=1)  # a trickle: they need the CPU
        time.sleep(0.1)
    filler.unlink()
    returned = time.monotonic()
    exited = not postmaster_running(pgdata)
    stack.start_postgres()  # where the postmaster gave up, as its supervisor would
    recovered = None
    while recovered is None and time.monotonic() - returned < 30:
        answer = post_jobs(stack, [digits(0)], clients=1)[0]
        if answer.status == 202:
            recovered = round(time.monotonic() - returned, 1)
        else:
            time.sleep(0.2)
    after = stack.submit([digits(i) for i in range(50)])
    during = [a.job_id for a in answers if a.job_id is not None]
    ids = long_jobs + before + calibration + during + after
    done = stack.wait_terminal(ids, 60 if guarded else 15, settle=not guarded)
    tally = stack.tally(
        "13. The disk under PostgreSQL full",
        "on" if guarded else "off: lease",
        ids,
        len(before) + 2 + len(long_jobs) + len(answers) + len(after),
    )
    tally.recovery_s = None if done is None else round(time.monotonic() - returned, 1)
    with stack.engine.connect() as conn:
        again = conn.execute(
            sa.text("SELECT count(*) FROM jobs WHERE id::text = ANY(:ids) AND attempts > 1"),
            {"ids": ids},
        ).scalar()

    def counted(some: list[Answer]) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for a in some:
            kind = str(a.status)
            if a.problem and "disk is full" in a.problem["detail"]:
                kind += " disk full"
            elif a.problem:
                kind += " did not answer"
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds

    tally.notes.append(
        f"tables full: {counted(answers[:tables_full])}; WAL full after {ended} segment "
        f"switch(es), PostgreSQL PANICked{', its postmaster exited' if exited else ''}: "
        f"{counted(answers[tables_full:])}; submits accepted {recovered} s after space "
        f"returned; {again} jobs run again"
    )
    check(tally, guarded, lambda t: t.lost > 0)
    refused = [a for a in answers if a.status != 202]
    assert any(a.problem and "disk is full" in a.problem["detail"] for a in refused), answers
    for a in refused:
        assert a.status == 503 and a.problem is not None, a
        assert a.problem["type"] == "/problems/service-unavailable", a
        assert a.retry_after is not None and int(a.retry_after) > 0, a
    assert ended < 8 and recovered is not None


STORE_MIB = 16
CHUNK_ROWS = 4096  # a chunk's result: 4096 rows of a label and 10 probabilities, 192 KiB
ROOM = 64 * 1024  # left on the full store: a result or an upload is cut off part way


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


class Client:
    """The stack's API as a tenant uses it for batches."""

    def __init__(self, stack: FaultStack) -> None:
        self.base, self.headers = stack.base, {"Authorization": f"Bearer {stack.api_key}"}

    def upload(self, data: bytes, name: str) -> requests.Response:
        return requests.post(f"{self.base}/files", params={"filename": name}, data=data,
                             headers={**self.headers, "Content-Type": "application/octet-stream"},
                             timeout=60)  # fmt: skip

    def files(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = self.get("/files").json()["items"]
        return listed

    def batch(self, file_id: str) -> str:
        answer = requests.post(f"{self.base}/batches", json={"model": "digits", "file_id": file_id},
                               headers=self.headers, timeout=30)  # fmt: skip
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def get(self, path: str, **headers: str) -> requests.Response:
        return requests.get(f"{self.base}{path}", headers={**self.headers, **headers}, timeout=60)

    def wait_batch(self, batch_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            batch: dict[str, Any] = self.get(f"/batches/{batch_id}").json()
            if batch["status"] not in ("queued", "running") or time.monotonic() > deadline:
                return batch
            time.sleep(0.2)


def chunk_ids(stack: FaultStack, batch_id: str) -> list[str]:
    with stack.engine.connect() as conn:
        return [str(i) for i in conn.execute(
            sa.text("SELECT id FROM jobs WHERE batch_id = :b ORDER BY batch_index"),
            {"b": batch_id},
        ).scalars()]  # fmt: skip


def store_objects(stack: FaultStack) -> list[str]:
    """Every file in the store but the filler: objects and temporary files alike."""
    root = stack.root / "store"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.name != FILLER)  # fmt: skip


def reference(model_repository: Path, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the model's file: what a result must hold."""
    card = ModelCard.load(model_repository / "digits" / "1")
    return SessionPool("cpu").run(card, {"pixels": pixels})


@GUARD
def test_14_the_file_store_full_during_an_upload_and_a_result_write(
    disk_stack: Callable[..., FaultStack],  # noqa: F811
    model_repository: Path,
    guarded: bool,
) -> None:
    """The file store on a small disk, filled up to 64 KiB from full. An upload then
    is refused, 507 problem+json, and leaves nothing. Batch A runs while the store
    stays full: each chunk's result is cut off part way, thrown away and tried
    again (store_unavailable) until its attempts run out, so A ends `failed` with
    no result object, and its results read as errors (JSONL) or a 409 (.npy),
    never as a short file. Batch B starts while the store is full and the space
    returns after its first failed write: B then succeeds whole, equal to ONNX
    Runtime. After, an upload and its batch C succeed. Without the `cap` guard,
    A's chunks try again for as long as the store stays full: A never ends."""
    stack = disk_stack(
        "" if guarded else "cap", store_mib=STORE_MIB,
        BATCH_CHUNK_ROWS=str(CHUNK_ROWS), JOB_MAX_ATTEMPTS="4",
    )  # fmt: skip
    stack.start_all(concurrency=2)
    api = Client(stack)
    rng = np.random.default_rng(14)
    pixels = (rng.random((4 * CHUNK_ROWS, 64)) * 16).astype(np.float32)
    uploaded = api.upload(npy(pixels), "pixels.npy")
    assert uploaded.status_code == 201, uploaded.text
    file_id = uploaded.json()["id"]
    objects_before = store_objects(stack)

    filler = fill(stack.root / "store", leave=ROOM)
    refused = api.upload(npy(pixels[: CHUNK_ROWS * 2]), "more.npy")  # 2 MiB, past the room
    assert refused.status_code == 507, refused.text
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert refused.json()["type"] == "/problems/insufficient-storage"
    assert int(refused.headers["Retry-After"]) > 0
    assert [f["id"] for f in api.files()] == [file_id]  # nothing of it listed ...
    assert store_objects(stack) == objects_before  # ... or left in the store

    batch_a = api.batch(file_id)
    ended_a = api.wait_batch(batch_a, timeout=45 if guarded else 12)
    ids_a = chunk_ids(stack, batch_a)
    statuses_a = stack.statuses(ids_a)
    if not guarded:
        tally = stack.tally("14. The file store full during an upload and a result write",
                            "off: cap", ids_a, len(ids_a), expect="failed")  # fmt: skip
        tally.notes.append(f"batch A {ended_a['status']} after 12 s of a full store; its "
                           f"chunks: {sorted(statuses_a.values())}")  # fmt: skip
        check(tally, guarded, lambda t: t.lost > 0)
        return
    assert ended_a["status"] == "failed", ended_a
    assert {f["error"] for f in ended_a["failed_rows"]} == {"retries_exhausted"}, ended_a
    assert not [o for o in store_objects(stack) if o.startswith(f"batches/{batch_a}")]
    assert store_objects(stack) == objects_before  # no part, no temporary file left
    npy_a = api.get(f"/batches/{batch_a}/results", Accept="application/x-npy")
    assert npy_a.status_code == 409 and npy_a.json()["type"] == "/problems/conflict", npy_a.text
    lines_a = [
        json.loads(line) for line in api.get(f"/batches/{batch_a}/results").text.splitlines()
    ]
    assert len(lines_a) == len(pixels) and all("error" in line for line in lines_a)

    batch_b = api.batch(file_id)
    deadline, ids_b = time.monotonic() + 30, []
    while True:  # its first write failed: the space returns
        ids_b = chunk_ids(stack, batch_b)
        with stack.engine.connect() as conn:
            failed_once = conn.execute(sa.text(
                "SELECT count(*) FROM jobs WHERE batch_id = :b AND error_code = 'store_unavailable'"
            ), {"b": batch_b}).scalar()  # fmt: skip
        if failed_once:
            break
        assert time.monotonic() < deadline, stack.statuses(ids_b)
        time.sleep(0.05)
    filler.unlink()
    returned = time.monotonic()
    ended_b = api.wait_batch(batch_b, timeout=45)
    assert ended_b["status"] == "succeeded", ended_b
    expected = reference(model_repository, pixels)
    got = np.load(io.BytesIO(api.get(f"/batches/{batch_b}/results",
                                     Accept="application/x-npy").content))  # fmt: skip
    assert got.shape == (len(pixels),)
    np.testing.assert_array_equal(got["label"], expected["label"])
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], rtol=1e-5)

    again = api.upload(npy(pixels[: CHUNK_ROWS * 2]), "more.npy")
    assert again.status_code == 201, again.text
    batch_c = api.batch(again.json()["id"])
    ended_c = api.wait_batch(batch_c, timeout=45)
    assert ended_c["status"] == "succeeded" and ended_c["rows_done"] == 2 * CHUNK_ROWS, ended_c
    ids_b, ids_c = chunk_ids(stack, batch_b), chunk_ids(stack, batch_c)
    done = stack.wait_terminal(ids_b + ids_c, timeout=10)
    ids = ids_a + ids_b + ids_c
    tally = stack.tally("14. The file store full during an upload and a result write", "on",
                        ids, len(ids))  # fmt: skip
    statuses = stack.statuses(ids)
    tally.completed = sum(statuses[i] == "failed" for i in ids_a) + sum(
        statuses[i] == "succeeded" for i in ids_b + ids_c
    )
    tally.recovery_s = None if done is None else round(time.monotonic() - returned, 1)
    with stack.engine.connect() as conn:
        attempts = dict(conn.execute(sa.text(
            "SELECT batch_id::text, sum(attempts) FROM jobs WHERE batch_id IS NOT NULL "
            "GROUP BY batch_id"
        )).all())  # fmt: skip
    tally.notes.append(
        f"upload while full: 507, nothing kept; batch A (store full throughout): failed, "
        f"{len(ids_a)} chunks retries_exhausted after {attempts[batch_a]} attempts, no "
        f"result object, .npy 409, JSONL all errors; batch B (space back after its first "
        f"failed write): succeeded, {len(ids_b)} chunks in {attempts[batch_b]} attempts, "
        f"equal to ONNX Runtime; upload and batch C after: succeeded"
    )
    check(tally, guarded, lambda t: False)
