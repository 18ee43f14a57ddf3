"""A job that kills its worker every time (here: the hard time limit) is stopped
by the attempt cap kept on its row, with a dead letter, not looped forever."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import select

from app.jobs.tables import DeadLetter
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import WorkerProcess, wait_for_job
from tests.support import wait_until


@pytest.mark.processes
def test_a_job_that_outlives_its_time_limit_every_time_is_capped(
    settings: Settings,
    auth: dict[str, str],
    tmp_path: Path,
    make_app: Callable[..., Flask],
) -> None:
    fast = settings.with_overrides(
        jobs_queue=f"{settings.jobs_queue}-limit", job_max_attempts=2, job_lease_seconds=1.0,
        retry_backoff_seconds=0.1, retry_backoff_max_seconds=0.2,
    )  # fmt: skip
    app = make_app(fast)
    client = app.test_client()
    worker = WorkerProcess(fast, tmp_path / "worker.log", concurrency=1,
                           JOB_TIME_LIMIT_SECONDS="1", JOB_LEASE_SECONDS="1")  # fmt: skip
    try:
        body = {"model": "slow", "inputs": {"x": [[0.1] * 64], "steps": [3_000_000]}}
        job_id = client.post("/jobs", json=body, headers=auth).json["id"]

        def capped() -> bool:
            if client.get(f"/jobs/{job_id}", headers=auth).json["status"] not in (
                "queued",
                "running",
            ):
                return True
            with container_of(app).scope():  # what beat does every SWEEP_INTERVAL_SECONDS
                container_of(app).worker.maintenance.sweep()
            return False

        wait_until(capped, "the job to be capped", 60, interval=0.3)
        job = wait_for_job(client, auth, job_id)
    finally:
        worker.stop()
    assert job["status"] == "failed" and job["attempts"] == 2, job
    assert job["error"]["code"] == "attempts_exhausted"
    log = worker.log_path.read_text()
    assert "exceeded the time limit of 1s" in log and "WorkerLostError" in log
    with container_of(app).scope() as session:
        letters = session.scalars(select(DeadLetter).where(DeadLetter.job_id == job["id"])).all()
    assert [letter.error_class for letter in letters] == ["WorkerLost"]
