"""Logs of the real processes: with LOG_FORMAT=json every line the API (granian)
and a worker write is a JSON object, and one job is followed across them by its
id; an idle control worker and beat write nothing, and a sweep that did
something writes one line."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from app.cli.launcher import api_command, beat_command, control_worker_command, worker_command
from app.platform.database import Database
from app.platform.settings import Settings
from tests.conftest import QUIET_WORKER, RUN_ID, insert_queued_job, make_tenant
from tests.observability.conftest import Service, scrape, value
from tests.support import free_port, wait_until

pytestmark = pytest.mark.processes  # each test starts its services

PIXELS = [[0, 0, 5, 13, 9, 1, 0, 0] * 8]


@pytest.fixture(scope="module")
def db(isolated: Settings) -> Iterator[Database]:
    database = Database(isolated.database_url)
    yield database
    database.engine.dispose()


def _hostname(name: str) -> str:
    return f"test-{RUN_ID}-{name}-{uuid.uuid4().hex[:4]}@%h"


def test_json_lines_follow_a_job_from_the_api_to_the_worker(
    isolated: Settings, db: Database, tmp_path: Path
) -> None:
    tenant = make_tenant(db)
    port = free_port()
    json_env = {"LOG_FORMAT": "json"}
    api = Service(api_command(f"127.0.0.1:{port}"), isolated, tmp_path, "api",
                  PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "api-metrics"), **json_env)  # fmt: skip
    worker = Service(worker_command(isolated.jobs_queue, 2, _hostname("w"), *QUIET_WORKER),
                     isolated, tmp_path, "worker", DRAIN_LINGER_MS="0", **json_env)  # fmt: skip
    try:
        worker.wait_for(" ready.")
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(base), "the API answers", 60)
        request_id = f"req-{uuid.uuid4().hex}"
        body = {"model": "digits", "inputs": {"pixels": PIXELS}}
        headers = {**tenant.headers, "X-Request-ID": request_id}
        response = requests.post(f"{base}/jobs", json=body, headers=headers, timeout=10)
        assert response.status_code == 202, response.text
        assert response.headers["X-Request-ID"] == request_id  # echoed
        job_id = response.json()["id"]
        # More submits than one process serves, to be counted by both API processes.
        others = [requests.post(f"{base}/jobs", json=body, headers=tenant.headers, timeout=10)
                  for _ in range(5)]  # fmt: skip
        assert all(r.status_code == 202 for r in others)
        generated = others[0].headers["X-Request-ID"]
        assert len(generated) == 32 and generated != request_id
        forged = {**tenant.headers, "X-Request-ID": 'x" "level": "ERROR'}
        refused = requests.get(f"{base}/jobs/{job_id}", headers=forged, timeout=10)
        assert refused.headers["X-Request-ID"] != forged["X-Request-ID"]  # not a sane token

        def finished() -> bool:
            status = requests.get(f"{base}/jobs/{job_id}", headers=tenant.headers, timeout=10)
            return bool(status.json()["status"] == "succeeded")

        wait_until(finished, "the job succeeded", 60)
        wait_until(lambda: any(line.get("job_id") == job_id for line in worker.json_lines()),
                   "the worker logged the job", 60)  # fmt: skip
        submitted = scrape(f"{base}/metrics")
    finally:
        api.stop()
        worker.stop()

    api_lines, worker_lines = api.json_lines(), worker.json_lines()  # every line is JSON
    for line in api_lines + worker_lines:
        assert {"ts", "level", "logger", "message"} <= set(line), line
    assert any(line["logger"] == "_granian" for line in api_lines)  # the server's own, too
    assert not any(line["logger"] == "granian.access" for line in api_lines)  # ours instead
    [submit] = [line for line in api_lines if line.get("request_id") == request_id]
    assert submit["logger"] == "app.requests" and submit["job_id"] == job_id
    assert submit["method"] == "POST" and submit["path"] == "/jobs" and submit["status"] == 202
    assert submit["tenant"] == _name(db, tenant.id)
    reads = [line for line in api_lines if line.get("job_id") == job_id and line is not submit]
    assert reads and all(line["path"] == f"/jobs/{job_id}" for line in reads)
    [done] = [line for line in worker_lines if line.get("job_id") == job_id]
    assert done["logger"] == "app.jobs" and done["status"] == "succeeded"
    assert done["model"] == "digits" and done["tenant"] == submit["tenant"]
    # No banner on stdout; only Celery's own notices of signals, which it writes there
    # itself ("worker: Warm shutdown (MainProcess)").
    printed = [line for line in worker.stdout_path.read_text().splitlines() if line]
    assert all(line.startswith("worker: ") for line in printed), printed
    # The API's processes counted into one directory: the scrape adds them up.
    assert value(submitted, "inference_jobs_submitted_total", model="digits") == 6


def _answers(base: str) -> bool:
    try:
        return requests.get(f"{base}/v2/health/live", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def _name(db: Database, tenant_id: int) -> str:
    with db.engine.connect() as conn:
        name: str = conn.execute(
            sa.text("SELECT name FROM tenants WHERE id = :id"), {"id": tenant_id}
        ).scalar_one()
    return name


def _since(service: Service, mark: int) -> list[str]:
    return service.lines()[mark:]


def test_an_idle_control_plane_logs_nothing_and_a_sweep_that_did_something_one_line(
    isolated: Settings, db: Database, tmp_path: Path
) -> None:
    metrics_port = free_port()
    control = Service(
        control_worker_command(isolated.control_queue, _hostname("c"), *QUIET_WORKER),
        isolated, tmp_path, "control", WORKER_METRICS_PORT=str(metrics_port),
        SWEEP_INTERVAL_SECONDS="1",
    )  # fmt: skip
    beat = Service(beat_command(tmp_path / "beat-schedule", "--max-interval", "1"),
                   isolated, tmp_path, "beat", SWEEP_INTERVAL_SECONDS="1")  # fmt: skip
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        control.wait_for(" ready.")
        beat.wait_for("beat: Starting")

        def sweeps() -> float:
            return value(scrape(url), "inference_sweeps_total")

        wait_until(lambda: sweeps() >= 2, "the first sweeps ran", 60)  # startup is over
        marks = len(control.lines()), len(beat.lines())
        before = sweeps()
        wait_until(lambda: sweeps() - before >= 5, "the sweeps to run while idle", 60)
        ran = sweeps() - before
        assert ran >= 5, "the sweeps did not run while idle"  # sweep-jobs and webhooks, each second
        assert _since(control, marks[0]) == [], f"{ran:g} idle sweeps logged"
        assert _since(beat, marks[1]) == []

        tenant = make_tenant(db)
        job_id = insert_queued_job(db, tenant.id, model="digits")
        with db.engine.begin() as conn:  # past its deadline: the next sweep expires it
            conn.execute(sa.text("UPDATE jobs SET deadline_at = now() - interval '1 second' "
                                 "WHERE id = :id"), {"id": job_id})  # fmt: skip

        def expired() -> bool:
            with db.engine.connect() as conn:
                status = conn.execute(
                    sa.text("SELECT status FROM jobs WHERE id = :id"), {"id": job_id}
                ).scalar_one()
            return bool(status == "expired")

        wait_until(expired, "the sweep expired the job", 60)
        after = sweeps()  # more sweeps, which find nothing again
        wait_until(lambda: sweeps() - after >= 4, "more sweeps after the one that expired", 60)
        lines: list[Any] = _since(control, marks[0])
        assert len(lines) == 1 and "sweep" in lines[0] and "'expired': 1" in lines[0], lines
        assert _since(beat, marks[1]) == []
        assert value(scrape(url), "inference_sweep_jobs_total", action="expired") == 1
    finally:
        control.stop()
        beat.stop()
