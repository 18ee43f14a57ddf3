"""Wake-ups: one Celery message per model and burst, not per job; none lost."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis
import sqlalchemy as sa
from flask import Flask
from sklearn.datasets import load_digits

from app.execution.dispatch import WAKE_AGAIN_AFTER_S, WAKE_FLAG_TTL_S
from app.jobs import claims as claiming
from app.jobs import transitions
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.sessions import SessionPool
from app.web.context import container_of, services
from tests.conftest import STAGED, TenantAuth, insert_queued_job, outputs_of, wait_for_job

PIXELS = load_digits().data.astype(np.float32)


@pytest.fixture
def idle(settings: Settings, make_app: Callable[..., Flask]) -> Iterator[Flask]:
    """An app on a queue no worker reads, so its wake-ups can be counted."""
    app = make_app(jobs_queue=f"{settings.jobs_queue}-wake")
    yield app
    client = redis.Redis.from_url(settings.redis_url)
    client.delete(container_of(app).settings.jobs_queue)
    client.delete(*client.keys("inference:wake*:*-wake:*") or ["none"])


def waiting_messages(app: Flask) -> int:
    settings = container_of(app).settings
    return int(redis.Redis.from_url(settings.redis_url).llen(settings.jobs_queue))


def row(i: int) -> dict[str, Any]:
    return {"pixels": [PIXELS[i].tolist()]}


def submit(app: Flask, auth: dict[str, str], i: int = 0, model: str = "digits") -> Any:
    body = {"model": model, "inputs": {"pixels": [PIXELS[i].tolist()]}}
    response = app.test_client().post("/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.json
    return response.json


def test_jobs_submitted_while_a_wake_up_is_pending_share_it(
    idle: Flask, auth: dict[str, str]
) -> None:
    for i in range(20):
        submit(idle, auth, i)
    assert waiting_messages(idle) == 1
    with idle.app_context():
        services().parts.dispatcher.taken("digits")  # a worker took it and is about to claim
    submit(idle, auth)
    assert waiting_messages(idle) == 2, "a job after the take needs a wake-up of its own"


def test_a_flag_left_by_a_waker_that_died_before_publishing_holds_wake_ups_back_briefly(
    idle: Flask, auth: dict[str, str]
) -> None:
    """A waker killed between setting the flag and publishing its message (a
    stream consumer SIGKILLed after its commit) left a flag with no message: a
    submit while the flag is fresh sends none (the message may be on its way),
    the first once it is older than WAKE_AGAIN_AFTER_S sends one, and the next
    shares that one. Before, every submit for the flag's 30 s sent none, and jobs
    made only then waited for the sweep."""
    settings = container_of(idle).settings
    flags = redis.Redis.from_url(settings.redis_url)
    flag = f"inference:wake:{settings.jobs_queue}:digits"
    flags.set(flag, "1", px=WAKE_FLAG_TTL_S * 1000)  # the dead waker's, just set
    submit(idle, auth)
    assert waiting_messages(idle) == 0
    # As if set a little longer than WAKE_AGAIN_AFTER_S ago (its time to live is its age).
    flags.pexpire(flag, int((WAKE_FLAG_TTL_S - WAKE_AGAIN_AFTER_S) * 1000) - 100)
    submit(idle, auth, 1)
    assert waiting_messages(idle) == 1, "the stale flag taken over"
    assert flags.pttl(flag) > (WAKE_FLAG_TTL_S - WAKE_AGAIN_AFTER_S) * 1000, "and made fresh"
    submit(idle, auth, 2)
    assert waiting_messages(idle) == 1, "the next submit shares the new wake-up"


def test_a_wake_up_passed_to_a_running_loop_never_holds_back_the_next(
    idle: Flask, auth: dict[str, str]
) -> None:
    """A worker that took a wake-up and found the machine's decode loop running
    passes it on: the loop sees new work pending; the next submit still sends a
    wake-up of its own (were the wake-up flag set without a message, no job would
    wake a worker until the flag expired); the loop's claim clears both."""
    with idle.app_context():
        dispatcher = services().parts.dispatcher
        submit(idle, auth)
        assert waiting_messages(idle) == 1
        dispatcher.taken("digits")
        assert not dispatcher.pending("digits")
        dispatcher.pass_to_loop("digits")
        assert dispatcher.pending("digits")
        submit(idle, auth, 1)
        assert waiting_messages(idle) == 2
        dispatcher.taken("digits")
        assert not dispatcher.pending("digits")


@pytest.mark.usefixtures("worker")
def test_a_batch_of_queued_jobs_runs_in_few_claims_with_direct_ort_results(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    ids = [
        insert_queued_job(database, tenant.id, {"pixels": [PIXELS[i].tolist()]}) for i in range(100)
    ]
    with app.app_context():
        assert services().parts.dispatcher.wake(STAGED)
    for job_id in ids[-3:]:
        assert wait_for_job(app.test_client(), tenant.headers, str(job_id))["status"] == "succeeded"
    with database.sessionmaker() as session:
        jobs = {
            j.id: j
            for j in session.scalars(
                sa.select(Job).where(Job.id.in_(ids)).options(sa.orm.undefer(Job.output_data))
            )
        }
    assert all(job.status == "succeeded" for job in jobs.values())
    # Jobs claimed in one UPDATE share its transaction's now(): the batches.
    claims = {job.started_at for job in jobs.values()}
    assert 2 <= len(claims) <= 10, len(claims)
    card = container_of(app).parts.repository.resolve(STAGED)
    direct = SessionPool("cpu", 1).run(card, {"pixels": PIXELS[:100]})
    for i, job_id in enumerate(ids):
        outputs = outputs_of(jobs[job_id])
        assert outputs is not None and outputs["label"] == [int(direct["label"][i])]
        assert np.array_equal(
            np.asarray(outputs["probabilities"], np.float32), direct["probabilities"][i : i + 1]
        )


@pytest.mark.usefixtures("worker")
def test_non_finite_outputs_fail_that_job_at_once_and_not_its_batch(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    poison = insert_queued_job(database, tenant.id, {"pixels": [[3e38] * 64]})
    good = [
        insert_queued_job(database, tenant.id, {"pixels": [PIXELS[i].tolist()]}) for i in range(5)
    ]
    with app.app_context():
        assert services().parts.dispatcher.wake(STAGED)
    failed = wait_for_job(app.test_client(), tenant.headers, str(poison))
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert failed["error"]["code"] == "non_finite_output"
    for job_id in good:
        assert wait_for_job(app.test_client(), tenant.headers, str(job_id))["status"] == "succeeded"


@pytest.mark.usefixtures("worker")
def test_a_job_whose_wake_up_was_lost_is_woken_by_the_sweep(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id, enqueued_seconds_ago=600)
    with container_of(app).scope():
        assert container_of(app).worker.maintenance.wake_waiting(older_than_s=60) >= 1
    assert wait_for_job(app.test_client(), tenant.headers, str(job_id))["status"] == "succeeded"


def test_the_sweep_wakes_a_backlog_with_one_message_per_model(
    idle: Flask, database: Database, tenant: TenantAuth
) -> None:
    for _ in range(30):
        insert_queued_job(database, tenant.id, enqueued_seconds_ago=600)
    with container_of(idle).scope():
        assert container_of(idle).worker.maintenance.wake_waiting(older_than_s=60) >= 30
    assert waiting_messages(idle) <= 3  # digits, and any other model a test left waiting


def test_claims_fill_one_call_by_rows_and_say_when_more_wait(
    database: Database, tenant: TenantAuth
) -> None:
    model = f"rows-{uuid.uuid4().hex[:6]}"  # no worker serves it: the test claims
    sizes = [100, 16, 16, 16, 16, 16, 16]
    ids = [insert_queued_job(database, tenant.id, model=model) for _ in sizes]
    with database.engine.begin() as conn:
        for job_id, rows in zip(ids, sizes, strict=True):
            conn.execute(
                sa.text("UPDATE jobs SET batch_rows = :rows WHERE id = :id"),
                {"rows": rows, "id": job_id},
            )
    claims = []
    with database.sessionmaker() as session:
        while True:
            claimed, more = claiming.claim_next(session, model, 64, lease_s=60)
            session.commit()
            if not claimed:
                break
            claims.append(([ids.index(job.id) for job in claimed], more))
    # The oversized job alone, then four of 16 rows (64), then the last two.
    assert claims == [([0], True), ([1, 2, 3, 4], True), ([5, 6], False)]


def test_jobs_back_from_a_worker_that_died_are_claimed_alone(
    database: Database, tenant: TenantAuth
) -> None:
    """One of them may have killed it (its rows made the process run out of
    memory): run together again, it would take the others down with it at every
    attempt, until all of them were dead-lettered."""
    model = f"rows-{uuid.uuid4().hex[:6]}"  # no worker serves it: the test claims
    ids = [insert_queued_job(database, tenant.id, model=model) for _ in range(6)]
    with database.engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET batch_rows = 16 WHERE id = ANY(:ids)"),
                     {"ids": ids})  # fmt: skip
    with database.sessionmaker() as session:
        died, _ = claiming.claim_next(session, model, 64, lease_s=0.05)
        session.commit()
        assert [ids.index(job.id) for job in died] == [0, 1, 2, 3]
        time.sleep(0.2)  # their worker was killed: the leases run out
        back = transitions.take_back_expired_leases(session, 0, 0, 500)
        session.commit()
        assert set(ids[:4]) <= set(back)
        claims = []
        while True:
            claimed, _ = claiming.claim_next(session, model, 64, lease_s=60)
            session.commit()
            if not claimed:
                break
            claims.append([ids.index(job.id) for job in claimed])
    assert claims == [[0], [1], [2], [3], [4, 5]]


def test_a_job_records_the_rows_it_adds_to_a_batch(
    idle: Flask, database: Database, auth: dict[str, str]
) -> None:
    three = {"model": "digits", "inputs": {"pixels": PIXELS[:3].tolist()}}
    unbatched = {"model": "slow", "inputs": {"x": [[0.1] * 64] * 3, "steps": [1]}}
    ids = []
    for body in (three, unbatched):
        response = idle.test_client().post("/jobs", json=body, headers=auth)
        assert response.status_code == 202, response.json
        ids.append(response.json["id"])
    with database.sessionmaker() as session:
        rows = [session.get(Job, uuid.UUID(i)) for i in ids]
    assert [job.batch_rows for job in rows if job] == [3, 1]


def test_inputs_are_stored_at_their_declared_precision(
    idle: Flask, database: Database, auth: dict[str, str]
) -> None:
    rows = PIXELS[:100]
    body = {"model": "digits", "inputs": {"pixels": rows.tolist()}}
    response = idle.test_client().post("/jobs", json=body, headers=auth)
    assert response.status_code == 202
    with database.engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT inputs, input_data FROM jobs WHERE id = :id"),
            {"id": response.json["id"]},
        ).one()
    assert stored.inputs is None
    assert rows.astype(np.float32).nbytes <= len(stored.input_data) <= 1.1 * 4 * rows.size


@pytest.mark.usefixtures("worker")
def test_outputs_are_stored_at_their_declared_precision(
    app: Flask, database: Database, auth: dict[str, str]
) -> None:
    """Outputs are kept as bytes of their declared datatypes, not JSON digits, and
    read back as exactly what ONNX Runtime gave."""
    rows = PIXELS[:1000]
    client = app.test_client()
    body = {"model": STAGED, "inputs": {"pixels": rows.tolist()}}
    response = client.post("/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.json
    job = wait_for_job(client, auth, response.json["id"])
    assert job["status"] == "succeeded", job
    with database.engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT outputs, output_data FROM jobs WHERE id = :id"), {"id": job["id"]}
        ).one()
    card = container_of(app).parts.repository.resolve(STAGED)
    direct = SessionPool("cpu", 1).run(card, {"pixels": rows.astype(np.float32)})
    raw = sum(array.nbytes for array in direct.values())
    assert stored.outputs is None
    assert raw <= len(stored.output_data) <= 1.1 * raw
    assert job["outputs"]["label"] == direct["label"].tolist()
    served = np.asarray(job["outputs"]["probabilities"], np.float32)
    assert np.array_equal(served, direct["probabilities"])
