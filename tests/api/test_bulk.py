"""POST /jobs/bulk on real parts: each item its job or its own problem, in order;
idempotency keys per item; one bad item never refuses the others."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app.jobs.tables import Job
from app.platform.database import Database
from app.tenancy.keys import set_quotas
from app.tenancy.tables import Tenant
from app.web.schemas import MAX_BULK_JOBS
from tests.conftest import STAGED, TenantAuth, make_tenant, wait_for_job

ONE = {"pixels": [[0.5] * 64]}


def stored(database: Database, tenant: TenantAuth) -> list[Job]:
    with database.sessionmaker() as session:
        query = sa.select(Job).where(Job.tenant_id == tenant.id).order_by(Job.created_at)
        return list(session.scalars(query))


def bulk(client: FlaskClient, tenant: TenantAuth, jobs: Any) -> dict[str, Any]:
    response = client.post("/jobs/bulk", json={"jobs": jobs}, headers=tenant.headers)
    assert response.status_code == 202, response.json
    body: dict[str, Any] = response.json
    assert len(body["jobs"]) == len(jobs)
    assert body["accepted"] + body["refused"] == len(jobs)
    return body


def is_problem(item: dict[str, Any], status: int, index: int) -> bool:
    return (
        item.get("status") == status
        and item["type"].startswith("/problems/")
        and item["detail"]
        and item["index"] == index
    )


def test_each_item_is_its_job_or_its_own_problem_in_order(
    client: FlaskClient, database: Database, tenant: TenantAuth
) -> None:
    body = bulk(client, tenant, [
        {"model": STAGED, "inputs": ONE, "priority": 3},
        {"model": "no-such-model", "inputs": ONE},
        {"model": STAGED, "inputs": {"pixels": [[0.5] * 63]}},
        {"inputs": ONE},  # no model
        "not an object",
        {"model": STAGED, "inputs": ONE, "cancel_after": -1},
        {"model": STAGED, "inputs": {"pixels": [[0.5] * 64] * 2}, "cancel_after": 60},
    ])  # fmt: skip
    first, unknown, misfit, nameless, text, negative, second = body["jobs"]
    assert first["status"] == "queued" and first["priority"] == 3
    assert is_problem(unknown, 404, 1) and "no-such-model" in unknown["detail"]
    assert is_problem(misfit, 422, 2) and "pixels" in misfit["errors"]
    assert is_problem(nameless, 422, 3) and "model" in nameless["errors"]
    assert is_problem(text, 422, 4)
    assert is_problem(negative, 422, 5) and "cancel_after" in negative["errors"]
    assert second["status"] == "queued" and second["deadline_at"] is not None
    assert (body["accepted"], body["refused"]) == (2, 5)
    kept = {str(job.id) for job in stored(database, tenant)}
    assert kept == {first["id"], second["id"]}  # only the good ones were kept


def test_accepted_jobs_run_on_the_workers_and_equal_onnx_runtime(
    client: FlaskClient, tenant: TenantAuth, worker: Any, model_repository: Any
) -> None:
    rows = np.random.default_rng(7).random((12, 64), dtype=np.float32)
    body = bulk(client, tenant, [{"model": "digits", "inputs": {"pixels": [row.tolist()]}}
                                 for row in rows])  # fmt: skip
    session = ort.InferenceSession(str(next(model_repository.glob("digits/*/model.onnx"))))
    for row, item in zip(rows, body["jobs"], strict=True):
        done = wait_for_job(client, tenant.headers, item["id"])
        assert done["status"] == "succeeded", done
        [expected] = session.run(["probabilities"], {"pixels": row[None]})
        assert np.allclose(done["outputs"]["probabilities"], expected, atol=1e-6)


def test_a_repeated_bulk_returns_each_items_first_job(
    client: FlaskClient, database: Database, tenant: TenantAuth
) -> None:
    jobs = [{"model": STAGED, "inputs": ONE, "idempotency_key": f"order-{n}"} for n in range(3)]
    first = bulk(client, tenant, jobs)
    again = bulk(client, tenant, [*jobs, {"model": STAGED, "inputs": ONE}])
    assert [item["id"] for item in again["jobs"][:3]] == [item["id"] for item in first["jobs"]]
    assert len(stored(database, tenant)) == 4  # three keyed jobs once, one new
    single = client.post(
        "/jobs", json={"model": STAGED, "inputs": ONE},
        headers={**tenant.headers, "Idempotency-Key": "order-1"},
    )  # fmt: skip
    assert single.status_code == 202 and single.json["id"] == first["jobs"][1]["id"]

    other = bulk(client, tenant, [
        {"model": STAGED, "inputs": {"pixels": [[0.25] * 64]}, "idempotency_key": "order-0"},
    ])  # fmt: skip
    assert is_problem(other["jobs"][0], 422, 0) and "idempotency_key" in other["jobs"][0]["errors"]
    stranger = make_tenant(database)
    theirs = bulk(client, stranger, jobs[:1])
    assert theirs["jobs"][0]["id"] != first["jobs"][0]["id"]  # keys are the tenant's own


def test_a_key_twice_in_one_bulk_is_one_job_or_an_error_for_another_request(
    client: FlaskClient, database: Database, tenant: TenantAuth
) -> None:
    keyed = {"model": STAGED, "inputs": ONE, "idempotency_key": "twice"}
    changed = {**keyed, "inputs": {"pixels": [[0.75] * 64]}}
    body = bulk(client, tenant, [keyed, keyed, changed])
    one, same, other = body["jobs"]
    assert same["id"] == one["id"] and is_problem(other, 422, 2)
    assert len(stored(database, tenant)) == 1


def test_concurrent_bulks_sharing_keys_make_each_job_once(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    jobs = [{"model": STAGED, "inputs": ONE, "idempotency_key": f"k{n}"} for n in range(20)]
    barrier = threading.Barrier(8)

    def post(_: int) -> list[dict[str, Any]]:
        client = app.test_client()
        barrier.wait()
        return list(bulk(client, tenant, jobs)["jobs"])

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    for n in range(20):
        items = [answer[n] for answer in answers]
        ids = {item["id"] for item in items if "id" in item}
        assert len(ids) == 1, items  # one job per key, whoever made it
        assert all("id" in item or is_problem(item, 409, n) for item in items)
    assert len(stored(database, tenant)) == 20


def test_a_bulk_must_hold_one_to_the_maximum_of_jobs(
    client: FlaskClient, tenant: TenantAuth
) -> None:
    for jobs in ([], [{"model": STAGED, "inputs": ONE}] * (MAX_BULK_JOBS + 1), "many", None):
        response = client.post("/jobs/bulk", json={"jobs": jobs}, headers=tenant.headers)
        assert response.status_code == 422, response.json
        assert response.content_type == "application/problem+json"
        assert "jobs" in response.json["errors"]
    assert client.post("/jobs/bulk", json={"jobs": [{}]}).status_code == 401


@pytest.mark.parametrize("limit", ["max_in_flight", "max_priority"])
def test_a_group_over_a_quota_is_refused_and_the_rest_accepted(
    make_app: Callable[..., Flask], database: Database, tenant: TenantAuth, limit: str
) -> None:
    with database.sessionmaker.begin() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == tenant.id))
        assert name is not None
        quotas = {"max_in_flight": 4} if limit == "max_in_flight" else {"max_priority": 4}
        set_quotas(session, name, quotas)
    client = make_app().test_client()
    high = [{"model": STAGED, "inputs": ONE, "priority": 5}] * 5
    low = [{"model": STAGED, "inputs": ONE, "priority": 1}] * 3
    body = bulk(client, tenant, [*high, *low])
    assert all(is_problem(item, 429 if limit == "max_in_flight" else 422, n)
               for n, item in enumerate(body["jobs"][:5])), body  # fmt: skip
    assert all(item["status"] == "queued" for item in body["jobs"][5:])
    assert len(stored(database, tenant)) == 3
