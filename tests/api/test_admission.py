"""A bound on each model's queue: past MAX_QUEUED_PER_MODEL every door answers
429 with Retry-After, keeps nothing of the refused request, and admits again
once the queue drains. Other models are not affected."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import sqlalchemy as sa
from flask import Flask

from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.sync.lane import Lane
from app.web.context import container_of
from tests.conftest import TenantAuth
from tests.support import FakeClock

ROW = [[1.0] * 64]


def test_a_full_queue_is_a_429_with_retry_after_at_every_door(
    settings: Settings,
    database: Database,
    tenant: TenantAuth,
    make_app: Callable[..., Flask],
    clock: FakeClock,
) -> None:
    # Its own queue, which no worker reads: what is admitted stays queued. (Sync calls
    # travel the sync lane, whose bound is its own: here it holds none.) The bound
    # counts every queued digits job of the database, earlier tests' left-overs too.
    with database.sessionmaker() as session:
        before = (
            session.scalar(
                sa.select(sa.func.count()).where(Job.model == "digits", Job.status == "queued")
            )
            or 0
        )
    limit = before + 3
    app = make_app(
        settings.with_overrides(max_queued_per_model=limit, jobs_queue=f"full-{uuid.uuid4().hex}",
                                sync_lane_max_waiting=0),
        clock=clock,
    )  # fmt: skip
    client, auth = app.test_client(), tenant.headers
    # The test plays a worker serving the queue (one never taking): the sync call is
    # refused for the lane's bound, not for want of a worker.
    queue = container_of(app).settings.model_queue
    Lane(container_of(app).parts.lane.client, 16).register(f"test-{queue}", [queue], 60.0)
    accepted = [client.post("/jobs", json={"model": "digits", "inputs": {"pixels": ROW}},
                            headers=auth) for _ in range(3)]  # fmt: skip
    assert [r.status_code for r in accepted] == [202, 202, 202]

    refused = client.post("/jobs", json={"model": "digits", "inputs": {"pixels": ROW}},
                          headers=auth)  # fmt: skip
    assert refused.status_code == 429, refused.json
    assert refused.mimetype == "application/problem+json"
    assert refused.json["type"].endswith("/queue-full")
    assert int(refused.headers["Retry-After"]) >= 1
    assert "MAX_QUEUED_PER_MODEL" in refused.json["detail"] and refused.json["limit"] == limit

    v2 = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": ROW[0]}]}
    sync = client.post("/v2/models/digits/infer", json=v2, headers=auth)
    assert sync.status_code == 429 and "Retry-After" in sync.headers
    assert "SYNC_LANE_MAX_WAITING" in sync.json["error"]  # where KServe clients read it
    batch = client.post("/batches", json={"model": "digits", "inputs": {"pixels": ROW}},
                        headers=auth)  # fmt: skip
    assert batch.status_code == 429
    with database.sessionmaker() as session:  # nothing of the refused requests was kept
        kept = session.scalar(
            sa.select(sa.func.count()).where(Job.tenant_id == tenant.id, Job.model == "digits")
        )
    assert kept == 3

    for response in accepted:  # the queue drains (here: cancelled) ...
        assert client.post(f"/jobs/{response.json['id']}/cancel", headers=auth).status_code == 200
    clock.advance(0.6)  # ... and the next reading of it admits again
    again = client.post("/jobs", json={"model": "digits", "inputs": {"pixels": ROW}}, headers=auth)
    assert again.status_code == 202
    client.post(f"/jobs/{again.json['id']}/cancel", headers=auth)
