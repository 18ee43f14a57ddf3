"""Fair dispatch and priorities: one tenant's flood does not starve another's
jobs, a higher priority goes first, and sync calls go ahead of async jobs."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from flask import Flask

from app.jobs import claims
from app.jobs.inserts import INSERT_JOBS
from app.platform.database import Database
from app.runtime.tensors import pack
from tests.conftest import STAGED, TenantAuth, make_tenant, wait_for_job
from tests.support import wait_until

SLOW_STEPS = 500  # about 1 ms of ONNX Runtime a job, one job a call


def stage(
    database: Database,
    tenant_id: int,
    count: int,
    *,
    model: str = STAGED,
    priority: int = 0,
    steps: int = SLOW_STEPS,
) -> list[uuid.UUID]:
    """`count` queued jobs written as the API writes them, with no wake-up: a
    backlog that is already there when the test's other jobs arrive."""
    if model == "slow":
        arrays: dict[str, Any] = {"x": np.full((1, 64), 0.1, np.float32),
                                  "steps": np.array([steps], np.int64)}  # fmt: skip
    else:
        arrays = {"pixels": np.zeros((1, 64), np.float32)}
    data = pack(arrays)
    row = {"tenant_id": tenant_id, "model": model, "model_version": "1", "status": "queued",
           "input_data": data, "batch_rows": 1, "attempts": 0, "max_attempts": 3,
           "priority": priority}  # fmt: skip
    rows = [{**row, "id": uuid.uuid4()} for _ in range(count)]
    with database.engine.begin() as conn:
        conn.execute(INSERT_JOBS, rows)
    return [r["id"] for r in rows]


def test_claims_take_turns_between_tenants_within_a_priority(database: Database) -> None:
    model = f"fair-{uuid.uuid4().hex[:8]}"  # a queue of this test's own: only its jobs
    a, b, c = (make_tenant(database) for _ in range(3))
    flood = stage(database, a.id, 30, model=model)
    few = stage(database, b.id, 3, model=model)
    urgent = stage(database, c.id, 2, model=model, priority=7)
    with database.sessionmaker() as session:
        claimed, more = claims.claim_next(session, model, 10, 60)
        session.commit()
    order = [job.id for job in claimed]
    assert more and len(order) == 10
    # Priority first (c's two), then a and b in turns (rows staged together share
    # their created_at, so which of a tenant's comes first is the database's choice).
    owner = {**dict.fromkeys(flood, "a"), **dict.fromkeys(few, "b"), **dict.fromkeys(urgent, "c")}
    assert [owner[i] for i in order] == ["c", "c", "a", "b", "a", "b", "a", "b", "a", "a"]
    assert set(order[:2]) == set(urgent) and set(few) <= set(order)


def test_a_claim_reads_the_index_not_the_whole_queue(database: Database) -> None:
    """The claim's cost does not grow with the queue: its plan walks ix_jobs_claim
    (a probe per waiting tenant, then each tenant's head) and never scans or sorts
    the model's queued jobs. So does the generic plan PostgreSQL may keep for the
    prepared statement after a few calls."""
    for _ in range(3):
        stage(database, make_tenant(database).id, 3000)
    statement = claims.claim_next_statement()
    params = {"model": STAGED, "max_rows": 64, "per_tenant": 128, "lease": 60}
    plans = []
    with database.engine.begin() as conn:
        conn.execute(sa.text("ANALYZE jobs"))
        for explained in (statement.text, statement.execute_clause):
            if explained is statement.execute_clause:
                conn.execute(sa.text("SET LOCAL plan_cache_mode = force_generic_plan"))
                prepared = conn.connection.info.setdefault("prepared", set())
                if statement.name not in prepared:  # as Prepared.execute does
                    conn.exec_driver_sql(statement.prepare)
                    prepared.add(statement.name)
            explain = sa.text("EXPLAIN " + str(explained))
            plans.append("\n".join(conn.execute(explain, params).scalars()))
    assert "$1" in plans[1], plans[1]  # generic: the model is a parameter there
    for plan in plans:
        assert "ix_jobs_claim" in plan, plan
        assert "Seq Scan on jobs" not in plan, plan


@pytest.mark.usefixtures("worker")
def test_a_flood_from_one_tenant_does_not_starve_another(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    """Tenant A has 5,000 jobs queued; tenant B's 20, submitted after, all finish
    while hundreds of A's jobs, created before them, are still waiting."""
    flooder = make_tenant(database)
    flood = stage(database, flooder.id, 5000, model="slow")
    client = app.test_client()
    body = {"model": "slow", "inputs": {"x": [[0.1] * 64], "steps": [SLOW_STEPS]}}
    ids = []
    for _ in range(20):  # the first submit wakes the model's workers
        response = client.post("/jobs", json=body, headers=tenant.headers)
        assert response.status_code == 202, response.json
        ids.append(response.json["id"])
    finished = [wait_for_job(client, tenant.headers, job_id, timeout=120) for job_id in ids]
    assert all(job["status"] == "succeeded" for job in finished), finished
    with database.engine.connect() as conn:
        last_b = conn.execute(
            sa.text("SELECT max(finished_at), min(created_at) FROM jobs WHERE id = ANY(:ids)"),
            {"ids": [uuid.UUID(i) for i in ids]},
        ).one()
        waiting = conn.scalar(
            sa.text(
                "SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND created_at < :b_first "
                "AND (started_at IS NULL OR started_at > :b_last)"
            ),
            {"ids": flood, "b_first": last_b[1], "b_last": last_b[0]},
        )
    assert waiting >= 300, f"only {waiting} of A's 5,000 earlier jobs were still waiting"


@pytest.mark.usefixtures("worker")
def test_a_sync_call_goes_ahead_of_queued_async_jobs(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    backlog = stage(database, tenant.id, 3000, model="slow")
    client = app.test_client()
    body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64},
                       {"name": "steps", "shape": [1], "datatype": "INT64",
                        "data": [SLOW_STEPS]}]}  # fmt: skip
    response = client.post("/v2/models/slow/infer", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.json

    def record() -> Any:  # the call's, written behind its answer
        with database.engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT started_at FROM jobs WHERE tenant_id = :t AND priority = 10"),
                {"t": tenant.id},
            ).one_or_none()

    sync = wait_until(record, "the sync call's record", 30)
    with database.engine.connect() as conn:
        after = conn.scalar(
            sa.text(
                "SELECT count(*) FROM jobs WHERE id = ANY(:ids) "
                "AND (started_at IS NULL OR started_at > :at)"
            ),
            {"ids": backlog, "at": sync.started_at},
        )
    assert after >= 2500, f"the sync call started after {3000 - after} of 3,000 queued jobs"


def test_priority_above_the_allowance_is_refused(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    client = app.test_client()
    body = {"model": "digits", "inputs": {"pixels": [[0.0] * 64]}, "priority": 7}
    refused = client.post("/jobs", json=body, headers=tenant.headers)
    assert refused.status_code == 422 and refused.content_type == "application/problem+json"
    assert "allowance of 5" in refused.json["detail"]
    body["priority"] = 10
    assert client.post("/jobs", json=body, headers=tenant.headers).status_code == 422
    body["priority"] = 5
    accepted = client.post("/jobs", json=body, headers=tenant.headers)
    assert accepted.status_code == 202 and accepted.json["priority"] == 5
