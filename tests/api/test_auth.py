"""API keys: looked up once per few seconds, and a revoked key stops working."""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy import event

from app import create_app
from app.config import Settings
from app.db.models import ApiKey, Tenant
from app.db.session import Database
from tests.conftest import TenantAuth


def test_a_key_is_looked_up_once_per_cache_period(
    settings: Settings, database: Database, tenant: TenantAuth
) -> None:
    app = create_app(settings.with_overrides(api_key_cache_seconds=60))
    client = app.test_client()
    statements: list[str] = []
    engine = app.extensions["database"].engine

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
    settings: Settings, database: Database, tenant: TenantAuth
) -> None:
    app = create_app(settings.with_overrides(api_key_cache_seconds=0.5))
    client = app.test_client()
    assert client.get("/jobs?limit=1", headers=tenant.headers).status_code == 200
    with database.engine.begin() as conn:
        conn.execute(
            sa.update(ApiKey).where(ApiKey.tenant_id == tenant.id).values(revoked_at=sa.func.now())
        )
    time.sleep(0.6)
    refused = client.get("/jobs?limit=1", headers=tenant.headers)
    assert refused.status_code == 401 and refused.content_type == "application/problem+json"


def test_an_unknown_key_is_refused_every_time(settings: Settings) -> None:
    client = create_app(settings).test_client()
    for _ in range(3):
        response = client.get("/jobs", headers={"Authorization": "Bearer ik_not-a-key"})
        assert response.status_code == 401


def test_manage_py_revokes_a_key_by_prefix_and_a_tenants_keys(
    settings: Settings, database: Database
) -> None:
    import json
    import subprocess
    import sys

    from app.config import ROOT
    from tests.conftest import make_tenant, service_env

    app = create_app(settings.with_overrides(api_key_cache_seconds=0.2))
    client = app.test_client()
    one, other = make_tenant(database), make_tenant(database)
    key = one.headers["Authorization"].split()[1]

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "manage.py", *args]
        env = service_env(settings)
        return subprocess.run(
            command, cwd=ROOT, env=env, text=True, capture_output=True, timeout=60
        )

    done = manage("revoke-api-key", "--prefix", key[:12])
    assert done.returncode == 0 and json.loads(done.stdout)["revoked"] == [key[:10]]
    time.sleep(0.3)
    assert client.get("/jobs?limit=1", headers=one.headers).status_code == 401
    assert client.get("/jobs?limit=1", headers=other.headers).status_code == 200
    with database.sessionmaker() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == other.id))
    assert manage("revoke-api-key", "--tenant", str(name)).returncode == 0
    time.sleep(0.3)
    assert client.get("/jobs?limit=1", headers=other.headers).status_code == 401
    again = manage("revoke-api-key", "--prefix", key)
    assert again.returncode != 0 and "no active key" in again.stderr
    assert manage("revoke-api-key").returncode != 0
