"""Coalesced inserts: concurrent submits share a commit; failures reach every caller."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from flask import Flask

from app.jobs.inserts import JobInserter
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import TenantAuth

PIXELS = {"pixels": [[0.0] * 64]}


def row(tenant_id: int) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(), "tenant_id": tenant_id, "model": "digits", "model_version": "1",
        "status": "queued", "inputs": PIXELS, "attempts": 0, "max_attempts": 3,
        "deadline_at": None, "webhook_url": None, "webhook_events": None,
    }  # fmt: skip


def test_concurrent_submits_share_transactions_and_all_commit(
    settings: Settings,
    database: Database,
    tenant: TenantAuth,
    make_app: Callable[..., Flask],
) -> None:
    app = make_app(settings.with_overrides(db_pool_size=24))  # a connection per request
    ids: list[str] = []
    barrier = threading.Barrier(24)

    def submit() -> None:
        client = app.test_client()
        barrier.wait()
        response = client.post(
            "/jobs", json={"model": "digits", "inputs": PIXELS}, headers=tenant.headers
        )
        assert response.status_code == 202
        ids.append(response.json["id"])

    threads = [threading.Thread(target=submit) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    container_of(app).parts.database.engine.dispose()
    with database.sessionmaker() as session:
        created = session.scalars(sa.select(Job.created_at).where(Job.id.in_(ids))).all()
    assert len(created) == 24
    # now() is the transaction's start: jobs written together share it.
    assert len(set(created)) < 24


def test_a_failed_batch_fails_every_caller(tenant: TenantAuth) -> None:
    unreachable = Database("postgresql://nobody@127.0.0.1:1/none")
    inserter = JobInserter(unreachable, wake=lambda _model: True)
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            inserter.insert(row(tenant.id))
        except sa.exc.OperationalError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 5


def test_a_failed_wake_up_leaves_the_rows_for_the_sweep(
    database: Database, tenant: TenantAuth
) -> None:
    inserter = JobInserter(database, wake=lambda _model: False)
    values = row(tenant.id)
    defaults = inserter.insert(values)
    assert defaults["created_at"] is not None
    with database.sessionmaker() as session:
        job = session.get(Job, values["id"])
        assert job is not None and job.status == "queued" and job.enqueued_at is None


def test_many_rows_of_one_submit_commit_together_or_not_at_all(
    database: Database, tenant: TenantAuth
) -> None:
    """A bulk's or a stream batch's rows are one unit, even above the writer's batch
    size: a bad row keeps every row of its submit out, and only those."""
    woken: list[str] = []
    inserter = JobInserter(database, wake=lambda model: woken.append(model) or True)
    good = [row(tenant.id) for _ in range(300)]  # more than MAX_BATCH (256)
    written = inserter.insert_many(good)
    assert [d["created_at"] for d in written] == [written[0]["created_at"]] * 300
    bad = [row(tenant.id) for _ in range(299)] + [{**row(tenant.id), "id": good[0]["id"]}]
    try:
        inserter.insert_many(bad)
        raise AssertionError("a duplicate id must refuse its submit")
    except sa.exc.IntegrityError:
        pass
    after = inserter.insert(row(tenant.id))  # the writer goes on
    assert after["created_at"] is not None
    with database.sessionmaker() as session:
        ids = [v["id"] for v in good + bad[:-1]]
        stored = set(session.scalars(sa.select(Job.id).where(Job.id.in_(ids))))
    assert stored == {v["id"] for v in good}, "none of the failed submit's rows is kept"
    assert woken and set(woken) == {"digits"}
