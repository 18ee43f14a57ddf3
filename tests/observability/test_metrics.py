"""/metrics and the workers' metrics endpoints, against what PostgreSQL says:
jobs submitted through the API, run by a real worker of two pool processes,
webhooks sent by a real webhook worker; both scraped over HTTP and parsed with
prometheus_client's parser."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.cli.launcher import worker_command
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from app.webhooks import delivery
from tests.conftest import (
    QUIET_WORKER,
    RUN_ID,
    TenantAuth,
    insert_queued_job,
    make_tenant,
    wait_for_job,
)
from tests.observability.conftest import Service, parse, scrape, value
from tests.support import free_port, starts_processes, wait_until

TOKEN = f"metrics-{uuid.uuid4().hex}"
PIXELS = [[0, 0, 5, 13, 9, 1, 0, 0] * 8]


@pytest.fixture(scope="module")
def hooks(isolated: Settings) -> Settings:
    """Webhooks to loopback, one attempt each (a failure is final: a dead letter)."""
    return isolated.with_overrides(
        webhook_allow_private_networks=True, webhook_retry_schedule=(0.0,), metrics_token=TOKEN
    )


@pytest.fixture(scope="module")
def api(hooks: Settings) -> Iterator[Flask]:
    app = create_app(hooks)
    yield app
    container_of(app).parts.database.engine.dispose()


@pytest.fixture(scope="module")
def db(isolated: Settings) -> Iterator[Database]:
    database = Database(isolated.database_url)
    yield database
    database.engine.dispose()


def _worker(settings: Settings, folder: Path, name: str, queue: str, **env: str) -> Service:
    hostname = f"test-{RUN_ID}-{name}-{uuid.uuid4().hex[:4]}@%h"
    args = worker_command(queue, 2, hostname, *QUIET_WORKER)
    service = Service(args, settings, folder, name, METRICS_TOKEN=TOKEN, **env)
    service.wait_for(" ready.")
    return service


@pytest.fixture(scope="module")
@starts_processes
def inference_worker(
    hooks: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, str, Path]]:
    """Two pool processes counting into one directory; the main process serves them."""
    folder = tmp_path_factory.mktemp("inference-worker")
    port, directory = free_port(), folder / "metrics"
    service = _worker(
        hooks, folder, "worker", hooks.jobs_queue, DRAIN_LINGER_MS="0",
        WORKER_METRICS_PORT=str(port), PROMETHEUS_MULTIPROC_DIR=str(directory),
    )  # fmt: skip
    yield service, f"http://127.0.0.1:{port}/metrics", directory
    service.stop()


@pytest.fixture(scope="module")
@starts_processes
def webhook_worker(hooks: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("webhook-worker")
    port = free_port()
    service = _worker(
        hooks, folder, "hooks", hooks.webhooks_queue, WEBHOOKS_QUEUE=hooks.webhooks_queue,
        WEBHOOK_ALLOW_PRIVATE_NETWORKS="true", WEBHOOK_RETRY_SCHEDULE="0",
        WEBHOOK_TIMEOUT_SECONDS="2", WORKER_METRICS_PORT=str(port),
        PROMETHEUS_MULTIPROC_DIR=str(folder / "metrics"),
    )  # fmt: skip
    yield f"http://127.0.0.1:{port}/metrics"
    service.stop()


@pytest.fixture(scope="module")
def tenant(db: Database) -> TenantAuth:
    return make_tenant(db)


def tenant_name(db: Database, tenant: TenantAuth) -> str:
    with db.engine.connect() as conn:
        name: str = conn.execute(
            sa.text("SELECT name FROM tenants WHERE id = :id"), {"id": tenant.id}
        ).scalar_one()
    return name


def submit(client: FlaskClient, tenant: TenantAuth, body: dict[str, Any]) -> str:
    response = client.post("/jobs", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.json
    job_id: str = response.json["id"]  # type: ignore[index]
    return job_id


def api_metrics(client: FlaskClient) -> Any:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.data
    assert response.content_type.startswith("text/plain")
    return parse(response.get_data(as_text=True))


def test_jobs_counted_by_the_api_and_the_worker_equal_the_database(
    api: Flask, db: Database, tenant: TenantAuth, inference_worker: tuple[Service, str, Path]
) -> None:
    _, worker_url, directory = inference_worker
    client, name = api.test_client(), tenant_name(db, tenant)
    # Two slow jobs at once: the first claim wakes the second pool process for the other.
    slow = {"model": "slow", "inputs": {"x": [[0.1] * 64], "steps": [400_000]}}
    ids = [submit(client, tenant, slow) for _ in range(2)]
    ids += [submit(client, tenant, {"model": "digits", "inputs": {"pixels": PIXELS}})
            for _ in range(10)]  # fmt: skip
    for job_id in ids:
        assert wait_for_job(client, tenant.headers, job_id, timeout=60)["status"] == "succeeded"

    with db.engine.connect() as conn:
        by_model = dict(conn.execute(sa.text(
            "SELECT model, count(*) FROM jobs WHERE tenant_id = :t AND status = 'succeeded' "
            "GROUP BY model"), {"t": tenant.id}).all())  # fmt: skip
    assert by_model == {"slow": 2, "digits": 10}

    submitted = api_metrics(client)
    for model, count in by_model.items():
        assert value(submitted, "inference_jobs_submitted_total", model=model, tenant=name) == count

    finished = scrape(worker_url, TOKEN)
    for model, count in by_model.items():
        labels = {"model": model, "tenant": name, "status": "succeeded"}
        assert value(finished, "inference_jobs_finished_total", **labels) == count
        assert value(finished, "inference_job_queued_seconds_count", model=model) == count
        assert value(finished, "inference_job_running_seconds_count", model=model) == count
        assert value(finished, "inference_claim_jobs_sum", model=model) == count  # jobs claimed
        assert value(finished, "inference_ort_call_rows_sum", model=model) == count  # 1 row each
        assert value(finished, "inference_ort_call_seconds_count", model=model) >= 1
    assert value(finished, "inference_job_running_seconds_sum", model="slow") > 0.1
    # Both pool processes ran jobs (each counts in its own files); the endpoint adds them up.
    pids = {file.stem.rsplit("_", 1)[1] for file in directory.glob("*.db")}
    assert len(pids) >= 2, sorted(directory.iterdir())


def test_queue_depth_is_the_number_of_queued_rows(
    api: Flask, db: Database, tenant: TenantAuth
) -> None:
    model = f"probe-{uuid.uuid4().hex[:6]}"  # no worker is ever woken for it
    for _ in range(7):
        job_id = insert_queued_job(db, tenant.id, model=model)
        with db.engine.begin() as conn:  # due in an hour, created a minute ago
            conn.execute(
                sa.text("UPDATE jobs SET run_after = now() + interval '1 hour', "
                        "created_at = now() - interval '60 seconds' WHERE id = :id"),
                {"id": job_id},
            )  # fmt: skip
    samples = api_metrics(api.test_client())
    with db.engine.connect() as conn:
        queued = conn.execute(
            sa.text("SELECT count(*) FROM jobs WHERE model = :m AND status = 'queued'"),
            {"m": model},
        ).scalar_one()
    assert queued == 7
    assert value(samples, "inference_queue_depth", model=model) == queued
    assert 60 <= value(samples, "inference_queue_oldest_age_seconds", model=model) < 600
    assert value(samples, "inference_database_up") == 1
    # Models of the repository with nothing queued read 0, rather than vanish.
    assert ("inference_queue_depth", frozenset({("model", "digits")})) in samples
    assert value(samples, "inference_queue_depth", model="digits") == 0


def test_a_webhook_failure_is_counted_by_the_webhook_worker(
    api: Flask, db: Database, tenant: TenantAuth, hooks: Settings, webhook_worker: str,
    inference_worker: tuple[Service, str, Path],
) -> None:  # fmt: skip
    client = api.test_client()
    closed = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    body = {"model": "digits", "inputs": {"pixels": PIXELS}, "webhook": {"url": closed}}
    job_id = submit(client, tenant, body)
    assert wait_for_job(client, tenant.headers, job_id)["status"] == "succeeded"

    def failed() -> bool:
        # What beat's webhook sweep does: take due deliveries, send them to the senders.
        container = container_of(api)
        with container.scope():
            container.webhooks.send_due(
                lambda delivery_id: container.parts.celery.send_task(
                    delivery.DELIVER_TASK, args=[delivery_id], queue=hooks.webhooks_queue
                )
            )
        with db.engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT count(*) FROM webhook_deliveries WHERE job_id = :j "
                        "AND status = 'failed'"), {"j": job_id}
            ).scalar_one() == 1  # fmt: skip

    wait_until(failed, "the delivery failed", 60, interval=0.1)
    with db.engine.connect() as conn:
        attempts, letters = conn.execute(sa.text(
            "SELECT (SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d "
            "        ON d.id = a.delivery_id WHERE d.job_id = :j), "
            "       (SELECT count(*) FROM dead_letters WHERE job_id = :j "
            "        AND delivery_id IS NOT NULL)"), {"j": job_id}).one()  # fmt: skip
    assert (attempts, letters) == (1, 1)
    samples = scrape(webhook_worker, TOKEN)
    assert value(samples, "inference_webhook_attempts_total", outcome="failed") == attempts
    assert value(samples, "inference_webhook_attempts_total", outcome="delivered") == 0
    assert value(samples, "inference_webhook_failures_total", reason="network") == attempts
    assert value(samples, "inference_dead_letters_total", model="digits", kind="webhook") == 1
    # The webhook worker counts no jobs: those are the inference worker's.
    assert value(samples, "inference_jobs_finished_total") == 0


def test_metrics_need_the_token_when_one_is_set(
    api: Flask, inference_worker: tuple[Service, str, Path]
) -> None:
    client = api.test_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401
        assert response.content_type == "application/problem+json"
        assert "METRICS_TOKEN" in response.json["detail"]
        assert requests.get(inference_worker[1], headers=headers, timeout=10).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_metrics_are_open_without_a_token(app: Flask) -> None:
    """The suite's own app sets no METRICS_TOKEN: no key needed (operators put it
    behind their network, or set the token)."""
    response = app.test_client().get("/metrics")
    assert response.status_code == 200
    assert "inference_queue_depth" in response.get_data(as_text=True)
