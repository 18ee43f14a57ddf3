"""Cancel, deadlines, dead letters and replay, over HTTP with a real worker."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from app.jobs.tables import AuditEvent, Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.tenancy.keys import create_operator_key
from app.web.context import container_of, services
from tests.conftest import TenantAuth, insert_queued_job, make_tenant, wait_for_job
from tests.models import HUGE, build_memhog
from tests.support import execute, wait_until

PIXELS = {"pixels": [[0.0] * 64]}


@pytest.fixture
def idle(settings: Settings, make_app: Callable[..., Flask]) -> Flask:
    """An app on a queue no worker reads: its jobs stay queued."""
    return make_app(jobs_queue=f"{settings.jobs_queue}-idle")


def post_job(client: FlaskClient, auth: dict[str, str], **extra: Any) -> dict[str, Any]:
    headers = {**auth, **extra.pop("headers", {})}
    response = client.post("/jobs", json={"model": "digits", "inputs": PIXELS, **extra},
                           headers=headers)  # fmt: skip
    assert response.status_code == 202, response.json
    body: dict[str, Any] = response.json
    return body


@pytest.mark.parametrize("verb", ["POST /cancel", "DELETE"])
def test_cancel_a_queued_job_then_again(idle: Flask, auth: dict[str, str], verb: str) -> None:
    client = idle.test_client()
    job = post_job(client, auth)

    def cancel() -> Any:
        if verb == "DELETE":
            return client.delete(f"/jobs/{job['id']}", headers=auth)
        return client.post(f"/jobs/{job['id']}/cancel", headers=auth)

    cancelled = cancel()
    assert cancelled.status_code == 200 and cancelled.json["status"] == "cancelled"
    assert cancelled.json["cancel_requested_at"] and cancelled.json["finished_at"]
    assert client.get(f"/jobs/{job['id']}", headers=auth).json["status"] == "cancelled"
    again = cancel()
    assert again.status_code == 409 and again.content_type == "application/problem+json"
    assert "already cancelled" in again.json["detail"] and again.json["job_status"] == "cancelled"


def test_cancel_is_tenant_scoped(idle: Flask, auth: dict[str, str], database: Database) -> None:
    client = idle.test_client()
    job = post_job(client, auth)
    other = make_tenant(database).headers
    assert client.post(f"/jobs/{job['id']}/cancel", headers=other).status_code == 404
    assert client.delete(f"/jobs/{job['id']}", headers=other).status_code == 404
    assert client.get(f"/jobs/{job['id']}", headers=auth).json["status"] == "queued"


@pytest.mark.usefixtures("worker")
def test_a_finished_job_cannot_be_cancelled(client: FlaskClient, auth: dict[str, str]) -> None:
    job = post_job(client, auth)
    assert wait_for_job(client, auth, job["id"])["status"] == "succeeded"
    response = client.post(f"/jobs/{job['id']}/cancel", headers=auth)
    assert response.status_code == 409 and response.json["job_status"] == "succeeded"


def test_cancel_after_expires_a_job_nobody_ran(idle: Flask, auth: dict[str, str]) -> None:
    client = idle.test_client()
    job = post_job(client, auth, headers={"Cancel-After": "0.3"})
    assert job["deadline_at"]

    def past_deadline() -> bool:  # by the database's clock, which the sweep reads
        with container_of(idle).parts.database.engine.connect() as conn:
            query = sa.text("SELECT deadline_at < now() FROM jobs WHERE id = :id")
            return bool(conn.scalar(query, {"id": job["id"]}))

    wait_until(past_deadline, "the job's Cancel-After deadline to pass")
    swept = container_of(idle)
    with swept.scope():
        swept.worker.maintenance.sweep()
    done = client.get(f"/jobs/{job['id']}", headers=auth).json
    assert done["status"] == "expired" and done["error"]["code"] == "deadline_exceeded"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"deadline": "2001-01-01T00:00:00+00:00"}, "deadline"),
        ({"deadline": "2099-01-01T00:00:00"}, "deadline"),  # no time zone
        ({"headers": {"Cancel-After": "-5"}}, "Cancel-After"),
    ],
    ids=["past deadline", "naive deadline", "negative Cancel-After"],
)
def test_bad_deadlines_are_422(
    client: FlaskClient, auth: dict[str, str], extra: Any, field: str
) -> None:
    headers = {**auth, **extra.pop("headers", {})}
    response = client.post("/jobs", json={"model": "digits", "inputs": PIXELS, **extra},
                           headers=headers)  # fmt: skip
    assert response.status_code == 422 and response.content_type == "application/problem+json"
    assert field in str(response.json["errors"])


def test_a_failed_wake_up_leaves_the_job_for_the_sweep(
    settings: Settings,
    auth: dict[str, str],
    app: Flask,
    worker: Any,
    make_app: Callable[..., Flask],
) -> None:
    """The broker is unreachable when the job is accepted: 202 all the same, and the
    job runs once the sweep wakes its model (a crash between commit and wake-up
    leaves the same state, which the sweep finds by the job's age)."""
    broken = make_app(settings.with_overrides(redis_url="redis://127.0.0.1:1/0"))
    job = post_job(broken.test_client(), auth)
    with app.app_context():
        row = services().parts.database.session().get(Job, uuid.UUID(job["id"]))
        assert row is not None and row.status == "queued" and row.enqueued_at is None
        assert services().worker.maintenance.wake_waiting(older_than_s=60) >= 1
    assert wait_for_job(app.test_client(), auth, job["id"])["status"] == "succeeded"


@pytest.fixture
def poisoned(app: Flask, database: Database, tenant: TenantAuth) -> list[uuid.UUID]:
    """Three memhog jobs that ran out of memory on their only attempt."""
    ids = [insert_queued_job(database, tenant.id, {"n": [HUGE]}, model="memhog") for _ in range(3)]
    with database.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE jobs SET max_attempts = 1 WHERE id = ANY(%s)", (ids,))
    outcomes = execute(container_of(app), ids)
    assert {o.error_code for o in outcomes} == {"retries_exhausted"}
    return ids


@pytest.fixture
def deploy_fix(model_repository: Path) -> Iterator[Callable[[], None]]:
    """Replace memhog's file with the fixed model, as an operator would; undone after."""
    yield lambda: build_memhog(model_repository, fixed=True)
    build_memhog(model_repository)


def letter_ids(client: FlaskClient, auth: dict[str, str], **query: Any) -> list[int]:
    page = client.get("/dead-letters", query_string=query, headers=auth)
    assert page.status_code == 200, page.json
    return [item["id"] for item in page.json["items"]]


def test_dead_letters_list_filter_and_read(
    client: FlaskClient, tenant: TenantAuth, poisoned: list[uuid.UUID], database: Database
) -> None:
    auth = tenant.headers
    items = client.get("/dead-letters", headers=auth).json["items"]
    assert {uuid.UUID(i["job_id"]) for i in items} == set(poisoned)
    letter = items[0]
    assert letter["error_code"] == "retries_exhausted" and letter["error_class"] == "Fail"
    assert "Failed to allocate memory" in letter["message"] and letter["attempts"] == 1
    assert letter["first_failed_at"] and letter["last_failed_at"]
    assert letter["traceback"] is None  # the service's files and lines: operators only
    with database.sessionmaker.begin() as session:
        operator = {"Authorization": f"Bearer {create_operator_key(session)}"}
    shown = client.get(f"/dead-letters/{letter['id']}/traceback", headers=operator)
    assert shown.status_code == 200 and "Failed to allocate memory" in shown.json["traceback"]
    assert client.get(f"/dead-letters/{letter['id']}/traceback", headers=auth).status_code == 403
    assert letter_ids(client, auth, model="digits") == []
    assert len(letter_ids(client, auth, error_code="retries_exhausted", model="memhog")) == 3
    assert letter_ids(client, auth, replayed="true") == []
    assert len(letter_ids(client, auth, since="2000-01-01T00:00:00+00:00")) == 3
    page = client.get("/dead-letters?limit=2", headers=auth).json
    rest = letter_ids(client, auth, cursor=page["next_cursor"])
    assert len(page["items"]) == 2 and len(rest) == 1
    assert client.get(f"/dead-letters/{letter['id']}", headers=auth).json == letter
    other = make_tenant(database).headers
    assert client.get(f"/dead-letters/{letter['id']}", headers=other).status_code == 404
    assert client.get("/dead-letters", headers=other).json["items"] == []


@pytest.mark.usefixtures("worker")
def test_replay_after_a_fix_succeeds_with_the_same_id_once(
    app: Flask,
    tenant: TenantAuth,
    poisoned: list[uuid.UUID],
    database: Database,
    deploy_fix: Callable[[], None],
) -> None:
    auth = tenant.headers
    deploy_fix()
    [letter] = letter_ids(app.test_client(), auth, limit=1)
    results: list[int] = []
    barrier = threading.Barrier(4)

    def replay() -> None:
        client = app.test_client()
        barrier.wait()
        results.append(client.post(f"/dead-letters/{letter}/replay", headers=auth).status_code)

    threads = [threading.Thread(target=replay) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [202, 409, 409, 409]

    client = app.test_client()
    replayed = client.get(f"/dead-letters/{letter}", headers=auth).json
    assert replayed["replayed_at"]
    done = wait_for_job(client, auth, replayed["job_id"])
    assert done["status"] == "succeeded" and done["outputs"] == {"total": 1000.0}
    assert done["attempts"] == 1
    with database.sessionmaker() as session:
        audit = session.scalars(
            select(AuditEvent).where(AuditEvent.subject == f"dead_letter:{letter}")
        ).all()
    assert [a.action for a in audit] == ["dead_letter.replay"]
    assert audit[0].detail is not None and audit[0].detail["job_id"] == replayed["job_id"]


@pytest.mark.usefixtures("worker")
def test_bulk_replay_by_filter(
    app: Flask, tenant: TenantAuth, poisoned: list[uuid.UUID], deploy_fix: Callable[[], None]
) -> None:
    deploy_fix()
    client = app.test_client()
    auth = tenant.headers
    response = client.post("/dead-letters/replay", json={"error_code": "retries_exhausted"},
                           headers=auth)  # fmt: skip
    assert response.status_code == 202
    assert response.json["replayed"] == 3 and set(map(uuid.UUID, response.json["job_ids"])) == set(
        poisoned
    )
    for job_id in poisoned:
        assert wait_for_job(client, auth, str(job_id))["status"] == "succeeded"
    again = client.post("/dead-letters/replay", json={}, headers=auth).json
    assert again["replayed"] == 0


def test_purge_removes_the_letter_and_is_audited(
    client: FlaskClient, tenant: TenantAuth, poisoned: list[uuid.UUID], database: Database
) -> None:
    auth = tenant.headers
    first, *_ = letter_ids(client, auth)
    assert client.delete(f"/dead-letters/{first}", headers=auth).status_code == 204
    assert client.get(f"/dead-letters/{first}", headers=auth).status_code == 404
    assert client.post(f"/dead-letters/{first}/replay", headers=auth).status_code == 404
    assert len(letter_ids(client, auth)) == 2
    with database.sessionmaker() as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.subject == f"dead_letter:{first}")
        ).all()
    assert actions == ["dead_letter.purge"]
