"""Submitting many jobs (`JobOperations.submit_many`): in one transaction, each
request's outcome in its place; a bad request is its own error and never the
others'."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from app.errors import (
    DomainError,
    InputsDoNotFit,
    InvalidRequest,
    QueueFull,
    QuotaExceeded,
    Unavailable,
    UnknownModel,
)
from app.jobs.tables import Job
from app.operations import InferRequest, JobRequest
from app.platform.database import Database
from app.sync import lane
from app.tenancy.tables import Tenant
from app.web.context import container_of
from tests.conftest import STAGED, TenantAuth, make_tenant
from tests.support import wait_until

ROW = {"pixels": [[1.0] * 64]}


def jobs_of(database: Database, tenant_id: int) -> list[Job]:
    with database.sessionmaker() as session:
        query = sa.select(Job).where(Job.tenant_id == tenant_id).order_by(Job.created_at)
        return list(session.scalars(query))


def test_each_request_gets_its_job_or_its_own_error_in_order(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    plane = container_of(app)
    requests = [
        JobRequest(STAGED, ROW, priority=3),
        JobRequest("no-such-model", ROW),
        JobRequest(STAGED, {"pixels": [[1.0] * 63]}),
        JobRequest(STAGED, ROW, idempotency_key="k"),
        JobRequest(STAGED, {"pixels": [[2.0] * 64, [3.0] * 64]}),
    ]
    with container_of(app).scope():
        outcomes = plane.jobs.submit_many(tenant.ref, requests)
    assert len(outcomes) == len(requests)
    first, unknown, misfit, keyed, second = outcomes
    assert isinstance(unknown, UnknownModel)
    assert isinstance(misfit, InputsDoNotFit) and "pixels" in misfit.extra["errors"]
    assert isinstance(first, Job) and isinstance(second, Job) and isinstance(keyed, Job)
    assert first.priority == 3 and second.batch_rows == 2
    stored = {job.id: job for job in jobs_of(database, tenant.id)}
    assert set(stored) == {first.id, keyed.id, second.id}  # only the good ones were kept
    assert all(job.status == "queued" and job.created_at for job in stored.values())


def test_a_group_refused_by_a_quota_leaves_the_others(app: Flask, database: Database) -> None:
    tenant = make_tenant(database)
    with database.sessionmaker() as session:
        session.execute(sa.update(Tenant).where(Tenant.id == tenant.id).values(max_priority=2))
        session.commit()
    plane = container_of(app)
    with container_of(app).scope():
        outcomes = plane.jobs.submit_many(
            tenant.ref, [JobRequest(STAGED, ROW, priority=9), JobRequest(STAGED, ROW, priority=1)]
        )
    refused, kept = outcomes
    assert isinstance(refused, InvalidRequest) and "allowance" in refused.detail
    assert isinstance(kept, Job) and [j.id for j in jobs_of(database, tenant.id)] == [kept.id]


def test_a_full_queue_refuses_its_models_requests_only(
    make_app: Callable[..., Flask], database: Database, tenant: TenantAuth
) -> None:
    app = make_app(max_queued_per_model=2)
    plane = container_of(app)
    with container_of(app).scope():
        outcomes = plane.jobs.submit_many(
            tenant.ref, [JobRequest("slow", {"x": [[0.1] * 64], "steps": [1]})] * 50
        )
    refused = [o for o in outcomes if isinstance(o, DomainError)]
    assert refused and all(isinstance(o, QueueFull) for o in refused)
    assert not [o for o in outcomes if isinstance(o, Job)]  # the whole group, or none of it


def test_staged_rows_commit_with_the_jobs_or_not_at_all(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    plane = container_of(app)
    seen: list[int] = []

    def beside(session: Session, jobs: list[Job]) -> None:
        seen.append(session.scalar(sa.select(sa.func.count()).where(
            Job.tenant_id == tenant.id)) or 0)  # fmt: skip
        raise RuntimeError("the door's own rows could not be written")

    with container_of(app).scope(), pytest.raises(RuntimeError):
        plane.jobs.submit_many(tenant.ref, [JobRequest(STAGED, ROW)] * 3, staged=beside)
    assert seen == [3]  # in the same transaction as the jobs...
    assert jobs_of(database, tenant.id) == []  # ...which was never committed


def test_start_calls_starts_each_call_or_says_why(
    make_app: Callable[..., Flask], database: Database, tenant: TenantAuth
) -> None:
    app = make_app(jobs_queue=f"calls-{uuid.uuid4().hex[:8]}")  # a queue no real worker takes
    plane = container_of(app)
    queue = plane.settings.model_queue
    # The test plays a worker that serves the queue (and takes nothing).
    lane.Lane(plane.parts.lane.client, 16).register(f"test-{queue}", [queue], 30.0)
    with container_of(app).scope():
        calls = plane.calls.start_calls(
            tenant.ref,
            [
                InferRequest(STAGED, ROW),
                InferRequest("nope", ROW),
                InferRequest(STAGED, ROW, timeout_s=2),
            ],
        )
    good, bad, timed = calls
    assert isinstance(bad, UnknownModel)
    assert not isinstance(good, DomainError) and not isinstance(timed, DomainError)
    assert good.job_id and timed.job_id and timed.timeout_s == 2
    # Both on the sync lane, in one push: no job row first (their records come after).
    assert good.lane_entry and timed.lane_entry and not jobs_of(database, tenant.id)
    first, second = lane.decode(good.lane_entry), lane.decode(timed.lane_entry)
    assert (first.id, first.model, first.tenant_id) == (good.job_id, STAGED, tenant.id)
    assert second.deadline - second.sent_at == pytest.approx(2)
    assert lane.decode(plane.parts.lane.client.lindex(lane.lane_key(queue), 0)).id == good.job_id  # type: ignore[arg-type]
    with container_of(app).scope():
        plane.calls.cancel(tenant.ref, [good, timed])
    assert plane.parts.lane.waiting(queue) == 0  # both withdrawn: no worker took them


def test_start_calls_refuses_at_once_when_no_worker_serves_the_queue(
    make_app: Callable[..., Flask], database: Database, tenant: TenantAuth
) -> None:
    app = make_app(jobs_queue=f"calls-{uuid.uuid4().hex[:8]}")
    plane = container_of(app)
    queue = plane.settings.model_queue
    with plane.scope():
        calls = plane.calls.start_calls(tenant.ref, [InferRequest(STAGED, ROW)] * 2)
    assert all(isinstance(call, Unavailable) for call in calls), calls
    refusal = calls[0]
    assert isinstance(refusal, Unavailable) and refusal.extra["queue"] == queue
    assert f"{STAGED}:1" in refusal.detail and (refusal.retry_after or 0) >= 1
    assert plane.parts.lane.waiting(queue) == 0 and jobs_of(database, tenant.id) == []


def test_each_request_counts_toward_the_submit_rate_and_refused_ones_take_none(
    app: Flask, database: Database
) -> None:
    tenant = make_tenant(database)
    with database.sessionmaker() as session:
        limit = sa.update(Tenant).where(Tenant.id == tenant.id).values(max_submits_per_second=3)
        session.execute(limit)
        session.commit()
    plane = container_of(app)
    # Early in a wall-clock second (the rate counts them in Redis), so all fit in one.
    wait_until(lambda: time.time() % 1 <= 0.3, "the start of a second", interval=0.02)
    with container_of(app).scope():
        five = plane.jobs.submit_many(tenant.ref, [JobRequest(STAGED, ROW)] * 5)
        three = plane.jobs.submit_many(tenant.ref, [JobRequest(STAGED, ROW)] * 3)
    assert all(isinstance(o, QuotaExceeded) for o in five)  # five a second, where three may
    assert all(isinstance(o, Job) for o in three)  # the refused five took none of the three
