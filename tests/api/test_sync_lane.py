"""The sync lane through worker and API deaths: a call whose worker died before
answering runs once more (an idempotent model) or is answered 503 with nothing
recorded; an answered call's record, written behind, survives the process that
answered it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import redis
import requests
from flask import Flask
from sqlalchemy import select

from app.jobs import staging
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.sync import records
from tests.conftest import LaneView, TenantAuth, WorkerProcess, service_env
from tests.support import free_port, wait_until

pytestmark = pytest.mark.processes

SLOW_ONCE = "slow-once"  # the slow model under a card that says it is not idempotent
INLINE = "digits-inline"


@pytest.fixture(scope="module")
def lane_models(model_repository: Path) -> Path:
    """`slow-once` (not idempotent) and `digits-inline` beside the test models."""
    once = model_repository / SLOW_ONCE / "1"
    if not once.exists():
        shutil.copytree(model_repository / "slow" / "1", once)
        card = json.loads((once / "card.json").read_text())
        (once / "card.json").write_text(json.dumps({**card, "idempotent": False}))
    inline = model_repository / INLINE / "1"
    if not inline.exists():
        shutil.copytree(model_repository / "digits" / "1", inline)
        card = json.loads((inline / "card.json").read_text())
        (inline / "card.json").write_text(json.dumps({**card, "execution": "inline"}))
    return model_repository


@pytest.fixture
def own_queue(settings: Settings, lane_models: Path) -> Settings:
    """Settings of a queue of this test's own: its lanes are served by its worker alone."""
    return settings.with_overrides(jobs_queue=f"lane-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def lane_worker(own_queue: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(own_queue, tmp_path / "worker.log", concurrency=1,
                            SYNC_LANE_LEASE_SECONDS="1")  # fmt: skip
    yield process
    process.stop()


def slow_body(seconds: float) -> dict[str, Any]:
    return {"inputs": [
        {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64},
        {"name": "steps", "shape": [1], "datatype": "INT64", "data": [int(seconds / 2e-6)]},
    ]}  # fmt: skip


def call_in_background(
    app: Flask, model: str, auth: dict[str, str]
) -> tuple[threading.Thread, dict[str, Any]]:
    got: dict[str, Any] = {}

    def call() -> None:
        response = app.test_client().post(f"/v2/models/{model}/infer", json=slow_body(1.5),
                                          headers=auth)  # fmt: skip
        got.update(status=response.status_code, body=response.json, headers=response.headers)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, got


def kill_when_taken(settings: Settings, worker: WorkerProcess, model: str) -> int:
    """SIGKILL the worker child once a call of `model` sits in its taken list."""
    lane = LaneView(settings)
    wait_until(lambda: lane.taken(model) > 0, f"a call of {model} taken", 30, 0.01)
    [child] = psutil.Process(worker.proc.pid).children()
    child.send_signal(signal.SIGKILL)
    return child.pid


def test_a_call_whose_worker_dies_runs_once_more_on_an_idempotent_model(
    own_queue: Settings, lane_worker: WorkerProcess, make_app: Callable[..., Flask],
    auth: dict[str, str], database: Database,
) -> None:  # fmt: skip
    app = make_app(own_queue)
    thread, got = call_in_background(app, "slow", auth)
    killed = kill_when_taken(own_queue, lane_worker, "slow")
    thread.join(60)
    assert got["status"] == 200, got
    job_id = got["body"]["parameters"]["job_id"]
    record = wait_until(lambda: _record(database, job_id), "the call's record", 30)
    assert record.status == "succeeded" and record.attempts == 2  # run again, once
    # The pool reaps the killed child and forks another in its own time.
    wait_until(lambda: killed not in _children(lane_worker), "the killed child reaped", 30)


def _children(worker: WorkerProcess) -> list[int]:
    return [p.pid for p in psutil.Process(worker.proc.pid).children()]


def test_a_call_whose_worker_dies_on_a_model_not_idempotent_is_answered_503(
    own_queue: Settings, lane_worker: WorkerProcess, make_app: Callable[..., Flask],
    auth: dict[str, str], database: Database,
) -> None:  # fmt: skip
    app = make_app(own_queue)
    thread, got = call_in_background(app, SLOW_ONCE, auth)
    kill_when_taken(own_queue, lane_worker, SLOW_ONCE)
    thread.join(60)
    assert got["status"] == 503, got
    assert "not idempotent" in got["body"]["detail"] and int(got["headers"]["Retry-After"]) >= 1
    job_id = got["body"]["job_id"]
    time.sleep(2.0)  # the writers' rounds: nothing is recorded of a call never answered
    assert _record(database, job_id) is None

    # The worker's new child serves the lane: a call is answered once it does (until
    # then, with no live worker on the queue, a call is refused at once: 503).
    def answered() -> bool:
        response = app.test_client().post(f"/v2/models/{SLOW_ONCE}/infer",
                                          json=slow_body(0.01), headers=auth)  # fmt: skip
        assert response.status_code in (200, 503), response.json
        return response.status_code == 200

    wait_until(answered, "the worker's new child to answer", 60, 0.2)


def test_a_journaled_record_its_writer_left_is_written_by_a_worker(
    settings: Settings, worker: Any, database: Database, tenant: TenantAuth
) -> None:
    """A process that answered calls and died before writing their records left
    them in the journal: a live worker's writer writes them once older than the
    grace. One the table refuses (its tenant deleted since) is dropped, not left
    to block the rest."""
    now = datetime.now(UTC)
    good, orphan = (
        staging.call_record(
            ("digits", "1"), 1, tenant_id, now, 0.001, outputs={"label": np.array([3])}
        )
        for tenant_id in (tenant.id, 2**31 - 7)
    )
    client = redis.Redis.from_url(settings.redis_url)
    entry = records.journal(client, [orphan, good])  # and nobody writes them
    written = wait_until(lambda: _record(database, str(good["id"])), "the record", 30)
    assert written.status == "succeeded" and written.tenant_id == tenant.id
    wait_until(lambda: not client.xrange(records.JOURNAL, entry, entry), "the entry gone", 10)
    assert _record(database, str(orphan["id"])) is None


def test_two_writers_draining_the_same_records_at_once_do_not_deadlock(
    settings: Settings, database: Database, tenant: TenantAuth
) -> None:
    """Once a dead process's entries pass the grace, every live writer drains them
    at once: the same rows, each writer in the order it read them. Inserted in
    one order (by id) they wait on each other instead of deadlocking."""
    client = redis.Redis.from_url(settings.redis_url)
    writers = [records.RecordWriter(database, lambda: client) for _ in range(2)]
    now = datetime.now(UTC)
    for _ in range(5):
        made = [
            staging.call_record(("digits", "1"), 1, tenant.id, now, 0.001,
                                outputs={"label": np.array([i % 10])})
            for i in range(400)
        ]  # fmt: skip
        failures: list[BaseException] = []
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=_write_at_once, args=(start, failures, writer, these))
            for writer, these in zip(writers, (made, made[::-1]), strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == []
        with database.sessionmaker() as session:
            ids = [record["id"] for record in made]
            assert len(session.scalars(select(Job.id).where(Job.id.in_(ids))).all()) == len(made)


def _write_at_once(
    start: threading.Barrier,
    failures: list[BaseException],
    writer: records.RecordWriter,
    these: list[records.Record],
) -> None:
    start.wait()
    try:
        writer.write([], these)
    except BaseException as exc:
        failures.append(exc)


def test_an_inline_calls_record_survives_the_api_killed_right_after_answering(
    settings: Settings, lane_models: Path, worker: Any, database: Database,
    auth: dict[str, str],
) -> None:  # fmt: skip
    port = free_port()
    env = service_env(settings, MODEL_REPOSITORY=str(lane_models))
    api = subprocess.Popen(
        [sys.executable, "-m", "app.cli.api_server", "--bind", f"127.0.0.1:{port}",
         "--workers", "1"], cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _live(base), "the API", 60)
        body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": [1.0] * 64}]}  # fmt: skip
        response = requests.post(f"{base}/v2/models/{INLINE}/infer", json=body, headers=auth,
                                 timeout=30)  # fmt: skip
        os.killpg(api.pid, signal.SIGKILL)  # right after its answer
    finally:
        if api.poll() is None:
            os.killpg(api.pid, signal.SIGKILL)
        api.wait(10)
    assert response.status_code == 200, response.text
    job_id = response.json()["parameters"]["job_id"]
    record = wait_until(lambda: _record(database, job_id), "the record of the answered call", 30)
    assert record.status == "succeeded" and record.model == INLINE


def _live(base: str) -> bool:
    try:
        return requests.get(f"{base}/v2/health/live", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _record(database: Database, job_id: str) -> Job | None:
    with database.sessionmaker() as session:
        return session.scalar(select(Job).where(Job.id == uuid.UUID(job_id)))
