"""API keys: looked up once per few seconds, and a revoked key stops working."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable

import sqlalchemy as sa
from flask import Flask
from sqlalchemy import event

from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.tenancy.keys import KeyCache
from app.tenancy.tables import ApiKey, Tenant
from app.web.context import container_of
from tests.conftest import TenantAuth, make_tenant, service_env
from tests.support import FakeClock, wait_until


def test_a_key_is_looked_up_once_per_cache_period(
    settings: Settings,
    database: Database,
    tenant: TenantAuth,
    make_app: Callable[..., Flask],
) -> None:
    app = make_app(settings.with_overrides(api_key_cache_seconds=60))
    client = app.test_client()
    statements: list[str] = []
    engine = container_of(app).parts.database.engine

    def record(_conn: object, _cursor: object, sql: str, *_: object) -> None:
        statements.append(sql)

    event.listen(engine, "before_cursor_execute", record)
    try:
        for _ in range(5):
            assert client.get("/jobs?limit=1", headers=tenant.headers).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert sum("api_keys" in sql for sql in statements) == 1


def test_a_revoked_key_stops_working_once_its_cache_entry_expires(
    settings: Settings,
    database: Database,
    tenant: TenantAuth,
    make_app: Callable[..., Flask],
    clock: FakeClock,
) -> None:
    app = make_app(settings.with_overrides(api_key_cache_seconds=0.5), clock=clock)
    client = app.test_client()
    assert client.get("/jobs?limit=1", headers=tenant.headers).status_code == 200
    with database.engine.begin() as conn:
        conn.execute(
            sa.update(ApiKey).where(ApiKey.tenant_id == tenant.id).values(revoked_at=sa.func.now())
        )
    clock.advance(0.6)
    refused = client.get("/jobs?limit=1", headers=tenant.headers)
    assert refused.status_code == 401 and refused.content_type == "application/problem+json"


def test_an_unknown_key_is_refused_every_time(
    settings: Settings, make_app: Callable[..., Flask]
) -> None:
    client = make_app(settings).test_client()
    for _ in range(3):
        response = client.get("/jobs", headers={"Authorization": "Bearer ik_not-a-key"})
        assert response.status_code == 401


def run_manage(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "manage.py", *args]
    env = service_env(settings)
    return subprocess.run(command, cwd=ROOT, env=env, text=True, capture_output=True, timeout=60)


def test_a_key_with_a_lifetime_stops_working_when_it_expires_even_if_cached(
    settings: Settings, database: Database, make_app: Callable[..., Flask]
) -> None:
    app = make_app(api_key_cache_seconds=600)
    client = app.test_client()
    name = f"expiring-{uuid.uuid4().hex[:8]}"
    # ~10 s of life: the first request, right after, must come before it ends, even
    # on a busy machine where one manage.py run takes seconds
    made = run_manage(settings, "create-api-key", "--tenant", name, "--expires-in-days", "0.00012")
    assert made.returncode == 0, made.stderr
    key = made.stdout.split("api key:")[1].split()[0]
    expiring = {"Authorization": f"Bearer {key}"}
    assert client.get("/jobs?limit=1", headers=expiring).status_code == 200  # now cached
    shown = json.loads(run_manage(settings, "create-api-key", "--tenant", name, "--json").stdout)
    lasting = {"Authorization": f"Bearer {shown['api_key']}"}
    assert set(shown) == {"tenant", "api_key", "webhook_secret"}  # no expiry: as ever
    listed = [json.loads(line) for line in run_manage(settings, "list-api-keys", "--tenant", name)
              .stdout.splitlines()]  # fmt: skip
    assert [row["prefix"] for row in listed] == [key[:10], shown["api_key"][:10]]
    assert listed[0]["expires_at"] is not None and listed[1]["expires_at"] is None
    assert all("api_key" not in row for row in listed)
    wait_until(  # the key's own lifetime, in the database's time: real seconds
        lambda: client.get("/jobs?limit=1", headers=expiring).status_code != 200,
        "the key with a lifetime to expire",
        timeout=30,
        interval=0.2,
    )
    refused = client.get("/jobs?limit=1", headers=expiring)
    assert refused.status_code == 401 and "expired" in refused.json["detail"]
    with database.sessionmaker() as session:  # not cached anywhere: the query refuses it
        assert KeyCache(0).caller(session, key) is None
    assert client.get("/jobs?limit=1", headers=lasting).status_code == 200
    bad = run_manage(settings, "create-api-key", "--tenant", name, "--expires-in-days", "-1")
    assert bad.returncode != 0 and "expires-in-days" in bad.stderr


def test_manage_py_revokes_a_key_by_prefix_and_a_tenants_keys(
    settings: Settings,
    database: Database,
    make_app: Callable[..., Flask],
    clock: FakeClock,
) -> None:
    app = make_app(settings.with_overrides(api_key_cache_seconds=0.2), clock=clock)
    client = app.test_client()
    one, other = make_tenant(database), make_tenant(database)
    key = one.headers["Authorization"].split()[1]

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return run_manage(settings, *args)

    done = manage("revoke-api-key", "--prefix", key[:12])
    assert done.returncode == 0 and json.loads(done.stdout)["revoked"] == [key[:10]]
    clock.advance(0.3)
    assert client.get("/jobs?limit=1", headers=one.headers).status_code == 401
    assert client.get("/jobs?limit=1", headers=other.headers).status_code == 200
    with database.sessionmaker() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == other.id))
    assert manage("revoke-api-key", "--tenant", str(name)).returncode == 0
    clock.advance(0.3)
    assert client.get("/jobs?limit=1", headers=other.headers).status_code == 401
    again = manage("revoke-api-key", "--prefix", key)
    assert again.returncode != 0 and "no active key" in again.stderr
    assert manage("revoke-api-key").returncode != 0
