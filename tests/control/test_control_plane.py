"""The control plane never waits behind the data plane, on real processes: an
inference worker busy with a backlog of thousands of slow jobs, beat, the control
worker and the webhook worker, each a real Celery process on this run's queues."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
import sqlalchemy as sa

from app import create_app
from app.execution.dispatch import SWEEP_TASK
from app.platform.database import Database
from app.platform.settings import Settings
from app.schedules.firing import TICK_TASK
from app.web.context import container_of
from app.webhooks.delivery import SWEEP_TASK as WEBHOOK_SWEEP_TASK
from tests.conftest import (
    STAGED,
    BeatProcess,
    TenantAuth,
    WorkerProcess,
    insert_queued_job,
)
from tests.control.conftest import plane_env
from tests.support import starts_processes, wait_until
from tests.webhooks.test_webhooks import ScriptedReceiver

BACKLOG = 3000
JOB_SECONDS = 20.0  # each backlog job holds the inference worker this long
SLOW_INPUTS = {"x": [[0.1] * 64], "steps": [int(JOB_SECONDS / 2e-6)]}


def kill_tree(worker: WorkerProcess) -> None:
    """SIGKILL a worker and its pool children (a slow job would hold a warm stop)."""
    for child in psutil.Process(worker.proc.pid).children(recursive=True):
        child.kill()
    worker.proc.kill()
    worker.proc.wait()
    worker.log.close()


def queued(database: Database, model: str) -> int:
    with database.engine.connect() as conn:
        count: int = conn.execute(
            sa.text("SELECT count(*) FROM jobs WHERE model = :m AND status = 'queued'"),
            {"m": model},
        ).scalar_one()
    return count


def status_of(database: Database, job_id: uuid.UUID) -> str:
    with database.engine.connect() as conn:
        status: str = conn.execute(
            sa.text("SELECT status FROM jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    return status


@pytest.fixture
@starts_processes
def busy_plane(
    plane: Settings, database: Database, tenant: TenantAuth, tmp_path: Path
) -> Iterator[Settings]:
    """The inference worker (one process) busy on a backlog of slow jobs, with beat,
    the control worker and the webhook worker running beside it."""
    env = plane_env(plane)
    with database.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, tenant_id, model, model_version, status, inputs) "
                "SELECT gen_random_uuid(), :t, 'slow', '1', 'queued', CAST(:inputs AS jsonb) "
                "FROM generate_series(1, :n)"
            ),
            {"t": tenant.id, "inputs": json.dumps(SLOW_INPUTS), "n": BACKLOG},
        )
    inference = WorkerProcess(plane, tmp_path / "worker.log", concurrency=1, **env)
    control = WorkerProcess(plane, tmp_path / "control.log", control=True, **env)
    hooks = WorkerProcess(
        plane.with_overrides(jobs_queue=plane.webhooks_queue), tmp_path / "hooks.log", 2, **env
    )
    beat = BeatProcess(plane, tmp_path, **env)
    try:
        app = create_app(plane)
        container_of(app).parts.dispatcher.wake("slow")

        def started() -> bool:
            with database.engine.connect() as conn:
                return bool(conn.execute(sa.text(
                    "SELECT count(*) FROM jobs WHERE model = 'slow' AND status = 'running'"
                )).scalar_one())  # fmt: skip

        wait_until(started, "the backlog to start", 60, interval=0.2)
        yield plane
    finally:
        beat.stop()
        kill_tree(inference)
        control.stop()
        hooks.stop()
        with database.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM jobs WHERE model = 'slow' AND tenant_id = :t"),
                         {"t": tenant.id})  # fmt: skip


def test_sweeps_run_while_a_backlog_holds_every_inference_worker(
    busy_plane: Settings, database: Database, tenant: TenantAuth
) -> None:
    receiver = ScriptedReceiver()
    try:
        overdue = insert_queued_job(database, tenant.id, model=STAGED)  # no worker runs it
        finished = insert_queued_job(database, tenant.id)
        started = time.monotonic()
        with database.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE jobs SET deadline_at = now() + interval '1 second' WHERE id = :id"),
                {"id": overdue},
            )
            conn.execute(
                sa.text(
                    "UPDATE jobs SET webhook_url = :url, webhook_events = '{job.succeeded}' "
                    "WHERE id = :id"
                ),
                {"url": f"{receiver.base}/done", "id": finished},
            )
            conn.execute(  # finished by its worker: the trigger queues its webhook
                sa.text(
                    "UPDATE jobs SET status = 'succeeded', finished_at = now(), "
                    "outputs = '{}' WHERE id = :id"
                ),
                {"id": finished},
            )
        expired_after = delivered_after = None
        while expired_after is None or delivered_after is None:
            elapsed = time.monotonic() - started
            assert elapsed < 12, (
                f"sweeps starved behind the backlog: expired after {expired_after}, "
                f"webhook delivered after {delivered_after}"
            )
            if expired_after is None and status_of(database, overdue) == "expired":
                expired_after = elapsed
            if delivered_after is None and receiver.at("/done"):
                delivered_after = elapsed
            time.sleep(0.1)
        left = queued(database, "slow")
        print(f"deadline expired after {expired_after:.1f}s, webhook delivered after "
              f"{delivered_after:.1f}s, {left} of {BACKLOG} backlog jobs still queued")  # fmt: skip
        assert left >= BACKLOG - 2, "the backlog drained: it held nothing"
    finally:
        receiver.server.shutdown()


@pytest.mark.processes
def test_beat_keeps_one_message_of_each_sweep_pending(
    plane: Settings, settings: Settings, tmp_path: Path
) -> None:
    """No worker consumes the control queue: beat sends each sweep once, not once a
    tick, so a stalled control worker finds one of each waiting, not thousands."""
    client = redis.Redis.from_url(settings.redis_url)
    sweeps = {SWEEP_TASK, WEBHOOK_SWEEP_TASK, TICK_TASK}

    def tasks(queue: str) -> list[str]:
        return [json.loads(m)["headers"]["task"] for m in client.lrange(queue, 0, -1)]

    beat = BeatProcess(plane, tmp_path, **plane_env(plane))
    try:
        # (beat takes a while to start on two busy cores: its first sweeps are waited
        # for, then six more ticks of every per-second sweep)
        queue = plane.control_queue
        wait_until(lambda: sweeps <= set(tasks(queue)),
                   lambda: f"beat's first sweeps on its queue: {tasks(queue)}", 90)  # fmt: skip
        time.sleep(6)
    finally:
        beat.stop()

    on_control = tasks(plane.control_queue)
    try:
        assert tasks(plane.jobs_queue) == [], "sweeps sent to the inference queue"
        counts = Counter(on_control)
        assert sweeps <= set(counts), on_control
        assert max(counts.values()) == 1, f"a sweep piled up: {counts}"
    finally:
        client.delete(plane.control_queue, plane.jobs_queue)
