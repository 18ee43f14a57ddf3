"""Idempotent submits, long-polling and Server-Sent Events, on real parts."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import TenantAuth, insert_queued_job, make_tenant, wait_for_job

BODY = {"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}


@pytest.fixture
def idle(settings: Settings, make_app: Callable[..., Flask]) -> Flask:
    """An app on a queue no worker reads: its jobs stay queued until the test acts."""
    return make_app(jobs_queue=f"{settings.jobs_queue}-idle")


def jobs_of(database: Database, tenant: TenantAuth) -> int:
    with database.sessionmaker() as session:
        return session.scalar(select(func.count()).where(Job.tenant_id == tenant.id)) or 0


def keyed(tenant: TenantAuth, key: str) -> dict[str, str]:
    return {**tenant.headers, "Idempotency-Key": key}


def test_a_repeated_submit_returns_the_first_job(
    idle: Flask, tenant: TenantAuth, database: Database
) -> None:
    client = idle.test_client()
    first = client.post("/jobs", json=BODY, headers=keyed(tenant, "order-1"))
    again = client.post("/jobs", json=BODY, headers=keyed(tenant, "order-1"))
    assert first.status_code == again.status_code == 202
    assert (
        again.json["id"] == first.json["id"]
        and again.headers["Location"] == first.headers["Location"]
    )
    assert jobs_of(database, tenant) == 1

    other = client.post("/jobs", json={**BODY, "inputs": {"pixels": [[1.0] * 64]}},
                        headers=keyed(tenant, "order-1"))  # fmt: skip
    assert other.status_code == 422 and other.content_type == "application/problem+json"
    assert "Idempotency-Key" in other.json["errors"]
    assert jobs_of(database, tenant) == 1

    stranger = make_tenant(database)
    theirs = client.post("/jobs", json=BODY, headers=keyed(stranger, "order-1"))
    assert theirs.status_code == 202 and theirs.json["id"] != first.json["id"]


def test_fifty_concurrent_submits_with_one_key_make_one_job(
    idle: Flask, tenant: TenantAuth, database: Database
) -> None:
    barrier = threading.Barrier(50)

    def post(_: int) -> tuple[int, str | None]:
        client = idle.test_client()
        barrier.wait()
        response = client.post("/jobs", json=BODY, headers=keyed(tenant, "burst"))
        return response.status_code, (response.json or {}).get("id")

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(post, range(50)))
    statuses = {status for status, _ in results}
    assert statuses <= {202, 409}, results
    assert len({job_id for status, job_id in results if status == 202}) == 1
    assert jobs_of(database, tenant) == 1


def test_a_key_longer_than_255_characters_is_422(idle: Flask, tenant: TenantAuth) -> None:
    response = idle.test_client().post("/jobs", json=BODY, headers=keyed(tenant, "k" * 256))
    assert response.status_code == 422 and "Idempotency-Key" in response.json["errors"]


def test_long_poll_returns_on_the_next_change(idle: Flask, tenant: TenantAuth) -> None:
    client = idle.test_client()
    job = client.post("/jobs", json=BODY, headers=tenant.headers).json
    cancel = threading.Timer(
        0.5, lambda: idle.test_client().post(f"/jobs/{job['id']}/cancel", headers=tenant.headers)
    )
    cancel.start()
    waited = client.get(f"/jobs/{job['id']}?wait=20", headers=tenant.headers)
    cancel.join()
    assert waited.status_code == 200 and waited.json["status"] == "cancelled"
    # A finished job answers at once; an unchanged one after the wait, unchanged.
    assert (
        client.get(f"/jobs/{job['id']}?wait=20", headers=tenant.headers).json["status"]
        == "cancelled"
    )
    other = client.post("/jobs", json=BODY, headers=tenant.headers).json
    assert (
        client.get(f"/jobs/{other['id']}?wait=0.3", headers=tenant.headers).json["status"]
        == "queued"
    )


def parse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if not line.startswith(":")
        )
        if fields:
            events.append({"id": int(fields["id"]), "event": fields["event"],
                           "data": json.loads(fields["data"])})  # fmt: skip
    return events


@pytest.fixture
def finished_job(client: FlaskClient, auth: dict[str, str], worker: Any) -> Iterator[str]:
    job_id: str = client.post("/jobs", json=BODY, headers=auth).json["id"]
    wait_for_job(client, auth, job_id)
    yield job_id


def test_event_stream_of_a_job_and_resume_elsewhere(
    client: FlaskClient,
    auth: dict[str, str],
    finished_job: str,
    settings: Settings,
    make_app: Callable[..., Flask],
) -> None:
    response = client.get(f"/jobs/{finished_job}/events", headers=auth)
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    events = parse_events(response.get_data(as_text=True))
    assert [e["event"] for e in events] == ["job.queued", "job.running", "job.succeeded"]
    assert [e["id"] for e in events] == sorted({e["id"] for e in events})
    final = events[-1]["data"]["job"]
    assert final == client.get(f"/jobs/{finished_job}", headers=auth).json

    # Reconnect to another API process with Last-Event-ID: nothing missed or repeated.
    other_process = make_app(settings).test_client()
    resume = {**auth, "Last-Event-ID": str(events[0]["id"])}
    resumed = other_process.get(f"/jobs/{finished_job}/events", headers=resume)
    assert parse_events(resumed.get_data(as_text=True)) == events[1:]
    second = events[1]["id"]
    by_query = client.get(f"/jobs/{finished_job}/events?last_event_id={second}",
                          headers=auth)  # fmt: skip
    assert parse_events(by_query.get_data(as_text=True)) == events[2:]


def test_event_stream_follows_a_live_job(
    idle: Flask, tenant: TenantAuth, database: Database
) -> None:
    client = idle.test_client()
    job = client.post("/jobs", json=BODY, headers=tenant.headers).json
    threading.Timer(
        0.5, lambda: idle.test_client().post(f"/jobs/{job['id']}/cancel", headers=tenant.headers)
    ).start()
    events = parse_events(client.get(f"/jobs/{job['id']}/events", headers=tenant.headers)
                          .get_data(as_text=True))  # fmt: skip
    assert [e["event"] for e in events] == ["job.queued", "job.cancelled"]
    assert events[-1]["data"]["job"]["status"] == "cancelled"
    other = make_tenant(database).headers
    assert client.get(f"/jobs/{job['id']}/events", headers=other).status_code == 404


def test_a_change_in_the_database_wakes_the_bus(idle: Flask, tenant: TenantAuth) -> None:
    """PostgreSQL NOTIFY (from the job_events trigger) reaches waiting requests."""
    client = idle.test_client()
    job_id = uuid.UUID(client.post("/jobs", json=BODY, headers=tenant.headers).json["id"])
    bus = container_of(idle).parts.events
    with bus.watching(job_id) as watch:
        seen = watch.version()
        client.post(f"/jobs/{job_id}/cancel", headers=tenant.headers)
        assert watch.wait(seen, timeout=10) > seen
    assert str(job_id) not in bus._changes, "a job nobody waits on leaves no trace"


def test_one_statement_wakes_every_job_it_changed(
    idle: Flask, tenant: TenantAuth, database: Database
) -> None:
    """A statement changing many jobs sends their ids in a few NOTIFYs; each
    waiter wakes, and jobs nobody waits on are not counted."""
    ids = [insert_queued_job(database, tenant.id) for _ in range(250)]
    bus = container_of(idle).parts.events
    watched = [ids[0], ids[199], ids[200], ids[-1]]  # either side of a 200-id chunk
    with ExitStack() as stack:
        watches = [stack.enter_context(bus.watching(job_id)) for job_id in watched]
        seen = [watch.version() for watch in watches]
        with database.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE jobs SET status = 'cancelled' WHERE id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": [str(i) for i in ids]},
            )
        for watch, before in zip(watches, seen, strict=True):
            assert watch.wait(before, timeout=10) == before + 1
        assert len(bus._changes) == len(watched)
    with database.engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT count(*) FROM job_events "
                "WHERE job_id = ANY(CAST(:ids AS uuid[])) AND status = 'cancelled'"
            ),
            {"ids": [str(i) for i in ids]},
        ).scalar_one()
    assert events == len(ids)
