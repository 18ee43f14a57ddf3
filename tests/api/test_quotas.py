"""Per-tenant quotas (set with `manage.py tenants set`) and the usage report:
a tenant over a quota gets 429 problem+json naming the limit, nothing of the
request is kept, and other tenants are not touched."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.tenancy.keys import set_quotas
from app.tenancy.tables import Tenant
from tests.conftest import STAGED, TenantAuth, make_tenant, service_env, wait_for_job
from tests.support import wait_until

ONE = {"pixels": [[0.0] * 64]}


def name_of(database: Database, tenant: TenantAuth) -> str:
    with database.sessionmaker() as session:
        return str(session.scalar(sa.select(Tenant.name).where(Tenant.id == tenant.id)))


@pytest.fixture
def limited(
    make_app: Callable[..., Flask], database: Database, tenant: TenantAuth
) -> Callable[..., FlaskClient]:
    """A client of a fresh app (no cached limits) after setting the tenant's quotas."""

    def limit(**quotas: float) -> FlaskClient:
        with database.sessionmaker.begin() as session:
            set_quotas(session, name_of(database, tenant), dict(quotas))
        return make_app().test_client()

    return limit


def quota_problem(response: Any, limit: str) -> dict[str, Any]:
    assert response.status_code == 429, response.json
    assert response.content_type == "application/problem+json"
    body: dict[str, Any] = response.json
    assert body["type"].endswith("/quota-exceeded") and body["limit"] == limit, body
    assert int(response.headers["Retry-After"]) >= 1
    return body


def test_jobs_in_flight_beyond_the_quota_are_refused_and_nothing_is_kept(
    limited: Callable[..., FlaskClient], database: Database, tenant: TenantAuth
) -> None:
    client = limited(max_in_flight=3)
    other = make_tenant(database)
    for _ in range(3):  # staged: no worker runs them, so they stay in flight
        body = {"model": STAGED, "inputs": ONE}
        assert client.post("/jobs", json=body, headers=tenant.headers).status_code == 202
    refused = quota_problem(
        client.post("/jobs", json={"model": STAGED, "inputs": ONE}, headers=tenant.headers),
        "max_in_flight",
    )
    assert refused["allowed"] == 3 and refused["used"] == 3
    with database.engine.connect() as conn:
        kept = conn.scalar(sa.select(sa.func.count()).where(Job.tenant_id == tenant.id))
    assert kept == 3
    body = {"model": STAGED, "inputs": ONE}
    assert client.post("/jobs", json=body, headers=other.headers).status_code == 202


def test_submits_a_second_beyond_the_quota_are_refused(
    limited: Callable[..., FlaskClient], database: Database, tenant: TenantAuth
) -> None:
    client = limited(max_submits_per_second=2)
    # The rate counts wall-clock seconds in Redis (shared by every API process), so
    # these waits are real: start early in a second, so five submits fit in it.
    wait_until(lambda: time.time() % 1 <= 0.3, "the start of a second", interval=0.02)
    codes = [
        client.post("/jobs", json={"model": STAGED, "inputs": ONE}, headers=tenant.headers)
        for _ in range(5)
    ]
    second = int(time.time())
    assert [r.status_code for r in codes] == [202, 202, 429, 429, 429]
    quota_problem(codes[2], "max_submits_per_second")
    wait_until(lambda: int(time.time()) > second, "the next second", interval=0.02)  # has room
    again = client.post("/jobs", json={"model": STAGED, "inputs": ONE}, headers=tenant.headers)
    assert again.status_code == 202


def test_priority_allowance_is_the_tenants_own(
    limited: Callable[..., FlaskClient], database: Database, tenant: TenantAuth
) -> None:
    client = limited(max_priority=8)
    body = {"model": STAGED, "inputs": ONE, "priority": 8}
    assert client.post("/jobs", json=body, headers=tenant.headers).status_code == 202
    body["priority"] = 9
    refused = client.post("/jobs", json=body, headers=tenant.headers)
    assert refused.status_code == 422 and "allowance of 8" in refused.json["detail"]


def test_batch_rows_a_day_beyond_the_quota_are_refused(
    limited: Callable[..., FlaskClient], database: Database, tenant: TenantAuth
) -> None:
    client = limited(max_batch_rows_per_day=100)

    def batch(rows: int) -> Any:
        body = {"model": "digits", "inputs": {"pixels": [[0.0] * 64] * rows}}
        return client.post("/batches", json=body, headers=tenant.headers)

    assert batch(80).status_code == 202
    refused = quota_problem(batch(30), "max_batch_rows_per_day")
    assert refused["used"] == 80 and refused["allowed"] == 100
    # Room comes back when the first batch leaves the 24 h window: about a day.
    assert 23 * 3600 <= int(batch(30).headers["Retry-After"]) <= 24 * 3600
    assert batch(20).status_code == 202


def test_stored_bytes_beyond_the_quota_are_refused_and_the_upload_is_not_kept(
    limited: Callable[..., FlaskClient], database: Database, tenant: TenantAuth
) -> None:
    client = limited(max_stored_bytes=1000)
    first = client.post("/files?filename=a.jsonl", data=b"x" * 800, headers=tenant.headers)
    assert first.status_code == 201, first.json
    refused = quota_problem(
        client.post("/files?filename=b.jsonl", data=b"y" * 500, headers=tenant.headers),
        "max_stored_bytes",
    )
    assert refused["used"] == 800
    listed = client.get("/files", headers=tenant.headers).json
    assert [f["id"] for f in listed["items"]] == [first.json["id"]]
    assert client.delete(f"/files/{first.json['id']}", headers=tenant.headers).status_code == 204
    again = client.post("/files?filename=b.jsonl", data=b"y" * 500, headers=tenant.headers)
    assert again.status_code == 201


def manage(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "manage.py", *args]
    env = service_env(settings)
    return subprocess.run(command, cwd=ROOT, env=env, text=True, capture_output=True, timeout=60)


def test_manage_py_sets_and_lists_quotas(
    settings: Settings, database: Database, tenant: TenantAuth
) -> None:
    name = name_of(database, tenant)
    done = manage(settings, "tenants", "set", name, "--max-in-flight", "7",
                  "--max-submits-per-second", "2.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_in_flight"] == 7
    listed = json.loads(manage(settings, "tenants", "list", name).stdout)
    assert listed["max_in_flight"] == 7 and listed["max_submits_per_second"] == 2.5
    assert listed["max_stored_bytes"] is None  # the setting's default applies
    cleared = manage(settings, "tenants", "set", name, "--max-in-flight", "default")
    assert json.loads(cleared.stdout)["max_in_flight"] is None
    for bad in (["--max-priority", "12"], ["--max-in-flight", "-1"], ["--max-in-flight", "x"]):
        refused = manage(settings, "tenants", "set", name, *bad)
        assert refused.returncode != 0 and refused.stderr, bad
    assert manage(settings, "tenants", "set", "no-such-tenant", "--max-in-flight", "1").returncode
    assert manage(settings, "tenants", "set", name).returncode != 0


@pytest.mark.usefixtures("worker")
def test_usage_reports_each_models_jobs_and_what_they_cost(
    app: Flask, client: FlaskClient, database: Database, tenant: TenantAuth
) -> None:
    other = make_tenant(database)
    ids = []
    for rows in (1, 3, 5):
        body = {"model": "digits", "inputs": {"pixels": [[0.0] * 64] * rows}}
        ids.append(client.post("/jobs", json=body, headers=tenant.headers).json["id"])
    client.post("/jobs", json={"model": "digits", "inputs": ONE}, headers=other.headers)
    jobs = [wait_for_job(client, tenant.headers, job_id) for job_id in ids]
    assert all(j["status"] == "succeeded" and j["compute_seconds"] > 0 for j in jobs), jobs
    assert all(0 < j["batch_share"] <= 1 for j in jobs)
    report = client.get("/usage", headers=tenant.headers)
    assert report.status_code == 200, report.json
    [digits] = [m for m in report.json["models"] if m["model"] == "digits"]
    assert digits["jobs"] == 3 and digits["succeeded"] == 3 and digits["rows"] == 9
    assert digits["compute_seconds"] == pytest.approx(sum(j["compute_seconds"] for j in jobs))
    assert digits["queued_seconds"] == pytest.approx(sum(j["queued_seconds"] for j in jobs))
    assert report.json["total"]["jobs"] == 3
    now = datetime.now(UTC)
    past = {
        "from": (now - timedelta(days=3)).isoformat(),
        "to": (now - timedelta(days=2)).isoformat(),
    }
    assert client.get("/usage", query_string=past, headers=tenant.headers).json["models"] == []
    backwards = {"from": now.isoformat(), "to": (now - timedelta(hours=1)).isoformat()}
    assert client.get("/usage", query_string=backwards, headers=tenant.headers).status_code == 422
    too_long = {"from": (now - timedelta(days=40)).isoformat(), "to": now.isoformat()}
    refused = client.get("/usage", query_string=too_long, headers=tenant.headers)
    assert refused.status_code == 422 and "31 days" in refused.json["detail"]
    assert client.get("/usage").status_code == 401
