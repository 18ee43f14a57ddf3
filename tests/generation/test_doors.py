"""The chat model through the other doors (KServe v2 over HTTP and gRPC), and
cancelling a running generation: by DELETE, and by a streaming client leaving."""

from __future__ import annotations

import http.client
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import redis
import sqlalchemy as sa
import tritonclient.grpc as triton
from flask import Flask
from flask.testing import FlaskClient

from app.generation.pieces import channel
from app.grpc.server import Running
from app.jobs import claims
from app.jobs.transitions import take_back_expired_leases
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import services
from tests.conftest import TenantAuth, WorkerProcess, wait_for_job
from tests.generation.test_jobs import sse
from tests.grpc.conftest import grpc_server  # noqa: F401  (the fixture)
from tests.support import LiveServer, own_chat_model, wait_until

pytestmark = pytest.mark.processes

PROMPT = "The capital of France is"
LONG = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}


def test_kserve_http_takes_text_input_and_answers_text_output(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
        "parameters": {"max_tokens": 2, "temperature": 0},
    }
    response = client.post("/v2/models/smollm2/infer", json=body, headers=auth)
    assert response.status_code == 200, response.json
    answer = response.json
    assert answer["outputs"] == [
        {"name": "text_output", "datatype": "BYTES", "shape": [1], "data": [" Paris."]}
    ]
    job = wait_for_job(client, auth, answer["parameters"]["job_id"])
    assert job["outputs"]["completion_tokens"] == 2


def test_kserve_grpc_model_infer_answers_the_whole_text(
    grpc_server: Running,  # noqa: F811
    tenant: TenantAuth,
    worker: WorkerProcess,
) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    try:
        text = triton.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
        headers = {"authorization": tenant.headers["Authorization"]}
        result = client.infer("smollm2", [text], headers=headers,
                              parameters={"max_tokens": 2, "temperature": 0})  # fmt: skip
        assert result.as_numpy("text_output").tolist() == [b" Paris."]
    finally:
        client.close()


def _running_with_text(client: FlaskClient, auth: dict[str, str], job_id: str) -> None:
    def started() -> bool:
        job = client.get(f"/jobs/{job_id}", headers=auth).json
        return job is not None and job["status"] == "running"

    wait_until(started, f"job {job_id} to run", 60)


def own_worker(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path, slots: int
) -> tuple[Flask, WorkerProcess]:
    """An API and a worker of their own queue, the worker's decode loop `slots` wide."""
    queue = f"slots-{slots}-{uuid.uuid4().hex[:8]}"
    app = make_app(jobs_queue=queue)
    process = WorkerProcess(settings.with_overrides(jobs_queue=queue), tmp_path / "worker.log",
                            concurrency=1, GENERATION_SLOTS=str(slots),
                            DRAIN_LINGER_MS="0")  # fmt: skip
    return app, process


@pytest.fixture
def one_slot(settings: Settings, make_app: Callable[..., Flask], tmp_path: Path) -> Iterator[Flask]:
    app, process = own_worker(settings, make_app, tmp_path, 1)
    yield app
    process.stop()


@pytest.mark.parametrize("verb", ["POST /cancel", "DELETE"])
def test_cancel_stops_a_running_generation_and_frees_its_slot(
    one_slot: Flask, auth: dict[str, str], verb: str
) -> None:
    """With one slot, a second job runs only once the first has left it: cancelled
    after a few tokens, the first keeps them; the second is answered long before
    the first's 2000 tokens (a minute and more) could have been made."""
    client = one_slot.test_client()
    first = client.post("/jobs", headers=auth, json={"model": "smollm2", "inputs": LONG,
                        "parameters": {"max_tokens": 2000, "temperature": 0}}).json  # fmt: skip
    second = client.post("/jobs", headers=auth, json={"model": "smollm2",
                         "inputs": {"prompt": PROMPT},
                         "parameters": {"max_tokens": 2, "temperature": 0}}).json  # fmt: skip
    assert first is not None and second is not None
    _running_with_text(client, auth, first["id"])
    time.sleep(1.0)  # a few tokens
    if verb == "DELETE":
        answer = client.delete(f"/jobs/{first['id']}", headers=auth)
    else:
        answer = client.post(f"/jobs/{first['id']}/cancel", headers=auth)
    assert answer.status_code == 200 and answer.json is not None
    assert answer.json["cancel_requested_at"] is not None
    cancelled = wait_for_job(client, auth, first["id"], timeout=30)
    assert cancelled["status"] == "cancelled"
    assert cancelled["outputs"]["finish_reason"] == "cancelled"
    assert 0 < cancelled["outputs"]["completion_tokens"] < 2000
    assert cancelled["outputs"]["text"]
    done = wait_for_job(client, auth, second["id"], timeout=30)
    assert done["status"] == "succeeded" and done["outputs"]["text"] == " Paris."


def test_a_streaming_client_that_leaves_cancels_its_generation(
    one_slot: Flask, auth: dict[str, str], serve: Callable[[Flask], LiveServer]
) -> None:
    server = serve(one_slot)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"model": "smollm2", "messages": LONG["messages"], "max_tokens": 2000,
            "temperature": 0, "stream": True}  # fmt: skip
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json", **auth})  # fmt: skip
    response = conn.getresponse()
    assert response.status == 200
    job_id = response.getheader("X-Job-Id")
    assert job_id
    texts: list[str] = []
    while len(texts) < 3:
        line = response.readline()
        if line.startswith(b"data: {"):
            delta: dict[str, Any] = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                texts.append(delta["content"])
    response.close()
    conn.close()  # the client goes away mid-answer
    client = one_slot.test_client()
    job = wait_for_job(client, auth, job_id, timeout=30)
    assert job["status"] == "cancelled"
    assert job["outputs"]["text"].startswith("".join(texts))
    assert job["outputs"]["completion_tokens"] < 2000


def _kill(process: WorkerProcess) -> None:
    """SIGKILL the worker and its pool children: a machine gone mid-generation."""
    parent = psutil.Process(process.proc.pid)
    for child in parent.children(recursive=True):
        child.kill()
    parent.kill()
    process.proc.wait(30)
    process.log.close()


def half_made(
    client: FlaskClient, auth: dict[str, str], model: str = "smollm2"
) -> tuple[dict[str, Any], str]:
    """An uninterrupted greedy generation's outputs, then the id of the same
    request's job once half of its text is recorded (a worker serving it)."""
    body = {"model": model, "inputs": {"prompt": "Once upon a time"},
            "parameters": {"max_tokens": 160, "temperature": 0}}  # fmt: skip
    whole = client.post("/jobs", json=body, headers=auth).json
    assert whole is not None
    reference = wait_for_job(client, auth, whole["id"], timeout=120)["outputs"]
    job_id = str(client.post("/jobs", json=body, headers=auth).json["id"])  # type: ignore[index]

    def halfway() -> bool:
        job = client.get(f"/jobs/{job_id}", headers=auth).json
        assert job is not None and job["status"] in ("queued", "running"), job
        return bool(job["outputs"]) and len(job["outputs"]["text"]) > 80

    wait_until(halfway, f"job {job_id} half made", 120, 0.01)
    return reference, job_id


def resumed_whole(
    client: FlaskClient, auth: dict[str, str], done: dict[str, Any], reference: dict[str, Any]
) -> list[dict[str, Any]]:
    """A job that went on in a second attempt: its outputs those of an uninterrupted
    run, its output events joined the same text; its events."""
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert done["outputs"] == reference
    events = sse(client.get(f"/jobs/{done['id']}/events", headers=auth).get_data(as_text=True))
    pieces = [e["data"] for e in events if e["event"] == "output"]
    assert "".join(pieces) == reference["text"]
    return events


def test_a_loop_whose_generation_went_to_another_worker_stops_making_its_text(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path, database: Database,
    auth: dict[str, str],
) -> None:  # fmt: skip
    """A worker cut off from the database past a generation's lease, its job claimed
    by another worker meanwhile, learns at its next renewal that the job is no longer
    its own: the generation leaves its batch, and its text stops reaching the job's
    followers (two attempts' tokens would interleave there). Its slot is free: the
    job, handed back by the other worker, is claimed again and finishes."""
    own, model = own_chat_model(settings, tmp_path / "models", "lost")
    app = make_app(own)
    client = app.test_client()
    lease_s = 1.5  # renewed every 0.5 s
    worker = WorkerProcess(own, tmp_path / "worker.log",
                           concurrency=1, DRAIN_LINGER_MS="0",
                           JOB_LEASE_SECONDS=str(lease_s))  # fmt: skip
    pubsub = redis.Redis.from_url(settings.redis_url).pubsub(ignore_subscribe_messages=True)
    try:  # (its end of text banned: it goes on until the checks are done)
        body = {"model": model, "inputs": {"prompt": "Once upon a time"},
                "parameters": {"max_tokens": 400, "temperature": 0,
                               "logit_bias": {"0": -100, "2": -100}}}  # fmt: skip
        job_id = str(client.post("/jobs", json=body, headers=auth).json["id"])  # type: ignore[index]
        pubsub.subscribe(channel(job_id))

        def text_flows() -> bool:
            return pubsub.get_message(timeout=0.1) is not None

        wait_until(text_flows, f"job {job_id}'s text flowing", 120, 0.01)
        # Another worker claims it, its lease run out (this one renews it no more).
        with database.sessionmaker.begin() as session:
            session.execute(sa.text("UPDATE jobs SET lease_expires_at = now() - interval "
                                    "'1 second' WHERE id = :id"), {"id": job_id})  # fmt: skip
            (other,) = claims.claim(session, [uuid.UUID(job_id)], 300)
        assert other.attempt == 2
        time.sleep(lease_s)  # a renewal (every third of the lease) and a step
        while pubsub.get_message(timeout=0.05) is not None:  # what was sent before it
            pass
        late = []
        quiet_until = time.monotonic() + lease_s
        while time.monotonic() < quiet_until:
            if (message := pubsub.get_message(timeout=0.05)) is not None:
                late.append(message["data"])
        assert late == [], f"{len(late)} piece(s) of the lost attempt sent after it was lost"
        job = client.get(f"/jobs/{job_id}", headers=auth).json
        assert job is not None and job["status"] == "running" and job["attempts"] == 2, job
        with database.sessionmaker.begin() as session:
            assert claims.hand_back(session, [other]) == {uuid.UUID(job_id)}
        with app.app_context():
            assert services().parts.dispatcher.wake(model, force=True)
        done = wait_for_job(client, auth, job_id, timeout=180)
    finally:
        pubsub.close()
        worker.stop()
    assert done["status"] == "succeeded" and done["attempts"] == 3, done
    outputs = done["outputs"]
    assert (outputs["finish_reason"], outputs["completion_tokens"]) == ("length", 400)
    assert "lease was lost" in (tmp_path / "worker.log").read_text()


def test_a_worker_killed_mid_generation_resumes_without_a_gap(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path, database: Database,
    auth: dict[str, str],
) -> None:  # fmt: skip
    """The worker dies with a generation half made; once its lease is taken back,
    another worker (taking over the dead one's loop lock) prefills the prompt and
    the tokens recorded and goes on. The
    text equals an uninterrupted run's; the output events join to it, none
    repeated; the usage counts each token once."""
    on_queue, model = own_chat_model(settings, tmp_path / "models", "resume")
    app = make_app(on_queue)
    client = app.test_client()
    first = WorkerProcess(on_queue, tmp_path / "first.log", concurrency=1, DRAIN_LINGER_MS="0")
    try:
        reference, job_id = half_made(client, auth, model)
    finally:
        _kill(first)
    job = client.get(f"/jobs/{job_id}", headers=auth).json
    assert job is not None and job["status"] == "running"
    made = job["outputs"]["text"]
    assert len(made) < len(reference["text"]), "the worker finished before it was killed"
    with database.engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                             "WHERE id = :id"), {"id": job_id})  # fmt: skip
    with database.sessionmaker.begin() as session:
        assert uuid.UUID(job_id) in take_back_expired_leases(session, 0.01, 0.01, 500)
    # The dead loop's machine lock is still there (it runs out in LOCK_S): the next
    # worker takes it over at once, its holder being gone.
    held = redis.Redis.from_url(settings.redis_url)
    assert list(held.scan_iter(f"inference:generating:{on_queue.jobs_queue}:{model}:*"))
    second = WorkerProcess(on_queue, tmp_path / "second.log", concurrency=1, DRAIN_LINGER_MS="0")
    try:
        with app.app_context():
            assert services().parts.dispatcher.wake(model, force=True)
        done = wait_for_job(client, auth, job_id, timeout=120)
    finally:
        second.stop()
    events = resumed_whole(client, auth, done, reference)
    assert [e["id"] for e in events] == sorted({e["id"] for e in events})
    kinds = [e["event"] for e in events if e["event"] != "output"]
    assert kinds == ["job.queued", "job.running", "job.queued", "job.running", "job.succeeded"]


def test_a_loop_that_lost_a_generation_s_lease_and_claims_it_again_makes_its_text_once(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path, database: Database,
    auth: dict[str, str],
) -> None:  # fmt: skip
    """A worker cut off from the database past a generation's lease (a partition)
    goes on decoding it; the sweep queues the job again, and the same loop may
    claim it anew once it reaches the database. The earlier attempt leaves the
    batch: the text equals an uninterrupted run's, each token once (both in the
    batch, every token went into the text twice), and its events join to it."""
    own, model = own_chat_model(settings, tmp_path / "models", "reclaim")
    client = make_app(own).test_client()
    worker = WorkerProcess(own, tmp_path / "worker.log", concurrency=1, DRAIN_LINGER_MS="0")
    try:
        reference, job_id = half_made(client, auth, model)
        # Its lease runs out and the sweep takes it back, in one transaction (the
        # loop's renewal waits for it, then finds the job queued, not its own).
        with database.sessionmaker.begin() as session:
            session.execute(sa.text("UPDATE jobs SET lease_expires_at = now() - interval "
                                    "'1 second' WHERE id = :id"), {"id": job_id})  # fmt: skip
            assert uuid.UUID(job_id) in take_back_expired_leases(session, 0.01, 0.01, 500)
        done = wait_for_job(client, auth, job_id, timeout=120)
    finally:
        worker.stop()
    resumed_whole(client, auth, done, reference)
