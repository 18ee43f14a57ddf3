"""Sharing the decode loop: fair slots between tenants, each tenant's budget of
tokens a minute, and a worker that shuts down handing its generations over."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from app.engine.core import LINGER_S
from app.engine.loop import LoopMeter
from app.generation.sharing import Holder, Waiter, preemptions
from app.jobs.claims import ClaimedJob
from app.platform.database import Database
from app.platform.embedded import stop_process
from app.platform.settings import Settings
from app.tenancy.keys import set_quotas
from app.tenancy.tokens import TokenMeter
from tests.conftest import TenantAuth, WorkerProcess, make_tenant, wait_for_job
from tests.generation.test_doors import own_worker
from tests.generation.test_jobs import sse
from tests.support import wait_until

LONG = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}

# -- the policy --------------------------------------------------------------------------


def _holders(*tenants: int, priority: int = 0) -> list[Holder]:
    return [Holder(f"{t}-{i}", t, priority, float(i)) for i, t in enumerate(tenants)]


def test_a_tenant_waiting_without_a_slot_takes_one_from_the_tenant_holding_most() -> None:
    pairs = preemptions(4, _holders(1, 1, 1, 2), [Waiter("b", 3, 0)])
    # Three tenants share four slots: one each at least; tenant 1 holds three.
    assert [(h.tenant, w.key) for h, w in pairs] == [(1, "b")]
    assert pairs[0][0].key == "1-2", "the youngest of them pauses: it lost the least"


def test_slots_are_taken_until_each_waiting_tenant_has_its_share() -> None:
    pairs = preemptions(4, _holders(1, 1, 1, 1), [Waiter("b", 2, 0)])
    assert len(pairs) == 1  # one a look: its next look takes the second
    pairs = preemptions(4, _holders(1, 1, 1, 2), [Waiter("b2", 2, 0)])
    assert [(h.tenant, w.key) for h, w in pairs] == [(1, "b2")]
    assert preemptions(4, _holders(1, 1, 2, 2), [Waiter("b3", 2, 0)]) == []  # 2 each: fair


def test_nothing_pauses_for_a_tenant_that_has_its_share_or_for_a_lower_priority() -> None:
    assert preemptions(2, _holders(1, 2), [Waiter("c", 3, 0)]) == []  # one slot each at least
    assert preemptions(4, _holders(1, 1, 1, 1, priority=5), [Waiter("b", 2, 1)]) == []
    pairs = preemptions(4, _holders(1, 1, 1, 1, priority=5), [Waiter("b", 2, 5)])
    assert len(pairs) == 1


# -- tokens a minute ---------------------------------------------------------------------


def test_the_token_window_counts_the_last_minute_and_when_it_frees(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    now = [1_000_000.0]
    meter = TokenMeter(lambda: client, uuid.uuid4().hex, clock=lambda: now[0])
    tenant = 1
    meter.add({tenant: 30})
    now[0] += 20
    meter.add({tenant: 50})
    assert meter.window(tenant).used == 80
    assert meter.window(tenant, 100).retry_after == 0  # room left
    # Spent at 60: the first 30 leave at 1,000,060, 40 s from now, leaving 50 < 60.
    assert meter.window(tenant, 60) == meter.window(tenant, 60).__class__(80, 40)
    now[0] += 41
    assert meter.window(tenant, 60).used == 50 and meter.window(tenant, 60).retry_after == 0
    now[0] += 60
    assert meter.window(tenant).used == 0


def test_a_loops_meter_counts_tokens_per_tenant_and_kind(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    meter = LoopMeter(TokenMeter(lambda: client, uuid.uuid4().hex))
    job = ClaimedJob(uuid.uuid4(), "metered", "1", None, b"", 1, 3, tenant_id=7)
    meter.charge(job, "metered", "prompt", 5)
    for _ in range(3):
        meter.charge(job, "metered", "completion", 1)
    meter.count("metered", None)
    assert meter.tokens.window(7).used == 8
    made = {kind: REGISTRY.get_sample_value("inference_generation_tokens_total",
                                            {"model": "metered", "kind": kind})
            for kind in ("prompt", "completion")}  # fmt: skip
    assert made == {"prompt": 5.0, "completion": 3.0}
    meter.count("metered", None)  # nothing new: nothing more
    assert meter.tokens.window(7).used == 8


# -- on a real worker ----------------------------------------------------------------------


@pytest.fixture
def two_slots(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path
) -> Iterator[Flask]:
    app, process = own_worker(settings, make_app, tmp_path, 2)
    yield app
    process.stop()


def _generate(client: FlaskClient, auth: dict[str, str], inputs: Any, max_tokens: int) -> str:
    body = {"model": "smollm2", "inputs": inputs,
            "parameters": {"max_tokens": max_tokens, "temperature": 0}}  # fmt: skip
    response = client.post("/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.json
    return str(response.json["id"])  # type: ignore[index]


def _status(client: FlaskClient, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    job: dict[str, Any] | None = client.get(f"/jobs/{job_id}", headers=auth).json
    assert job is not None
    return job


@pytest.mark.processes
def test_a_tenants_first_generation_starts_while_another_fills_every_slot(
    two_slots: Flask, auth: dict[str, str], database: Database
) -> None:
    """Tenant A's four long generations fill both slots; tenant B's short one
    takes a slot from A at once and is answered while all of A's still run. A's
    paused generations go on where they stopped: every one's text is the same
    greedy text."""
    client = two_slots.test_client()
    longs = [_generate(client, auth, LONG, 300) for _ in range(4)]
    wait_until(lambda: sum(_status(client, auth, j)["status"] == "running" for j in longs) == 2,
               "two of A's generations to run", 120)  # fmt: skip
    other = make_tenant(database)
    short = _generate(client, other.headers, {"prompt": "The capital of France is"}, 3)
    done = wait_for_job(client, other.headers, short, timeout=120)
    assert done["status"] == "succeeded" and done["outputs"]["text"] == " Paris.\n"
    still = [_status(client, auth, j)["status"] for j in longs]
    assert all(status in ("queued", "running") for status in still), still
    texts = {wait_for_job(client, auth, j, timeout=300)["outputs"]["text"] for j in longs}
    assert len(texts) == 1 and len(next(iter(texts))) > 200, texts


@pytest.mark.processes
def test_a_spent_token_budget_refuses_generations_with_retry_after(
    two_slots: Flask, auth: dict[str, str], tenant: TenantAuth, database: Database
) -> None:
    """A tenant allowed 30 tokens a minute runs one generation of more (5 + 29);
    its next generation is refused (429, Retry-After, on /jobs and on /v1), its
    one-shot jobs are not, another tenant's generations are not, and /usage
    shows the budget spent."""
    with database.sessionmaker.begin() as session:
        set_quotas(session, tenant.name, {"max_tokens_per_minute": 30})
    client = two_slots.test_client()
    first = _generate(client, auth, {"prompt": "The capital of France is"}, 40)
    done = wait_for_job(client, auth, first, timeout=120)
    assert done["status"] == "succeeded"
    took = done["outputs"]["total_tokens"]
    assert took > 30, done

    def refused() -> bool:
        window = client.get("/usage", headers=auth).json["tokens_per_minute"]  # type: ignore[index]
        assert window["used"] <= took, window  # each token counted once
        return bool(window["used"] == took)

    wait_until(refused, lambda: f"the tokens counted: {client.get('/usage', headers=auth).json}",
               30)  # fmt: skip
    body = {"model": "smollm2", "inputs": {"prompt": "Hello"}, "parameters": {"max_tokens": 2}}
    answer = client.post("/jobs", json=body, headers=auth)
    assert answer.status_code == 429 and answer.content_type == "application/problem+json"
    assert answer.json is not None and answer.json["limit"] == "max_tokens_per_minute"
    assert "max_tokens_per_minute" in answer.json["detail"]
    assert 1 <= int(answer.headers["Retry-After"]) <= 60
    hello = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    chat = client.post("/v1/chat/completions", headers=auth, json=hello)
    assert chat.status_code == 429 and chat.json is not None
    assert "max_tokens_per_minute" in chat.json["error"]["message"]
    assert chat.headers["Retry-After"]
    digits = client.post("/jobs", headers=auth,
                         json={"model": "digits", "inputs": {"pixels": [[0.0] * 64]}})  # fmt: skip
    assert digits.status_code == 202, digits.json
    other = make_tenant(database)
    assert client.post("/jobs", json=body, headers=other.headers).status_code == 202
    usage = client.get("/usage", headers=auth).json
    assert usage is not None
    window = usage["tokens_per_minute"]
    assert window["limit"] == 30 and window["used"] == took and 1 <= window["retry_after"] <= 60


def _loop_lock(settings: Settings, queue: str) -> bytes | None:
    """The value of the queue's decode loop lock: its holder process and run."""
    client = redis.Redis.from_url(settings.redis_url)
    keys = list(client.scan_iter(f"inference:generating:{queue}:smollm2:*"))
    return client.get(keys[0]) if keys else None


@pytest.mark.processes
def test_an_idle_loop_lingers_past_its_drain_time_until_other_work_waits(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path, auth: dict[str, str]
) -> None:
    """Idle past DRAIN_SECONDS, the decode loop keeps running, so the next call
    finds its model loaded and its prefixes kept (the same loop answers it); but
    a worker's only process is given back as soon as other work waits (a digits
    job queued behind the loop starts well before the loop's linger would end),
    and the worker stops at once when told to, not after the linger."""
    queue = f"linger-{uuid.uuid4().hex[:8]}"
    app = make_app(jobs_queue=queue)
    client = app.test_client()
    worker = WorkerProcess(settings.with_overrides(jobs_queue=queue), tmp_path / "w.log",
                           concurrency=1)  # fmt: skip
    try:
        first = wait_for_job(client, auth, _generate(client, auth, {"prompt": "Hi"}, 4), 180)
        looping = _loop_lock(settings, queue)
        time.sleep(1.5)  # past the drain time (1 s), idle
        second = wait_for_job(client, auth, _generate(client, auth, {"prompt": "Yo"}, 4), 60)
        assert looping is not None and _loop_lock(settings, queue) == looping, "a new loop"
        body = {"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}
        submitted = client.post("/jobs", json=body, headers=auth)
        assert submitted.status_code == 202, submitted.json
        digits = wait_for_job(client, auth, submitted.json["id"], timeout=60)
        # A wake-up left from the second call may start one more loop after the
        # digits job; with nothing to claim it ends once its linger is over.
        wait_until(lambda: _loop_lock(settings, queue) is None,
                   lambda: "the loop to end:\n" + worker.log_path.read_text()[-3000:],
                   3 * LINGER_S + 30)  # fmt: skip
        third = wait_for_job(client, auth, _generate(client, auth, {"prompt": "Oh"}, 4), 60)
        time.sleep(1.5)  # lingering again, past the drain time
        assert _loop_lock(settings, queue) is not None
        stop_process(worker.proc, timeout=LINGER_S / 2)  # SIGTERM, then SIGKILL
    finally:
        worker.stop()
    statuses = [first["status"], second["status"], digits["status"], third["status"]]
    assert statuses == ["succeeded"] * 4, statuses
    waited = _seconds(digits["started_at"]) - _seconds(digits["created_at"])
    assert waited < LINGER_S / 2, f"digits waited {waited:.1f}s for the lingering loop"
    assert worker.proc.returncode == 0, f"killed, not stopped: {worker.proc.returncode}"


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _loop_holder(settings: Settings, queue: str) -> int:
    """The worker main process whose pool child runs the queue's decode loop."""
    client = redis.Redis.from_url(settings.redis_url)
    [key] = list(client.scan_iter(f"inference:generating:{queue}:smollm2:*"))
    value = client.get(key)
    assert value is not None
    return int(psutil.Process(int(value.split(b":")[0])).ppid())


@pytest.mark.processes
def test_a_worker_shutting_down_hands_its_generation_over(
    settings: Settings, make_app: Callable[..., Flask], tmp_path: Path, auth: dict[str, str]
) -> None:
    """SIGTERM to the worker running a long generation: it records the text, queues
    the job again and exits at once (not after the rest of the answer); the
    other worker goes on from the recorded tokens. The text equals an
    uninterrupted run's, and the output events join to it, none repeated."""
    queue = f"hand-over-{uuid.uuid4().hex[:8]}"
    app = make_app(jobs_queue=queue)
    client = app.test_client()
    on_queue = settings.with_overrides(jobs_queue=queue)
    workers = [WorkerProcess(on_queue, tmp_path / f"w{i}.log", concurrency=1,
                             DRAIN_LINGER_MS="0") for i in range(2)]  # fmt: skip
    try:
        inputs = {"prompt": "Once upon a time"}
        reference = wait_for_job(client, auth, _generate(client, auth, inputs, 400), timeout=180)
        job_id = _generate(client, auth, inputs, 400)

        def under_way() -> bool:
            job = _status(client, auth, job_id)
            return job["status"] == "running" and len((job["outputs"] or {}).get("text", "")) > 40

        wait_until(under_way, f"job {job_id} under way", 120, 0.01)
        holder = _loop_holder(settings, queue)
        [leaving] = [w for w in workers if w.proc.pid == holder]
        began = time.monotonic()
        leaving.proc.send_signal(signal.SIGTERM)
        leaving.proc.wait(60)
        left_after = time.monotonic() - began
        assert _status(client, auth, job_id)["status"] in ("queued", "running")
        done = wait_for_job(client, auth, job_id, timeout=180)
    finally:
        for worker in workers:
            worker.stop()
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert done["outputs"] == reference["outputs"], (left_after, done["outputs"])
    events = sse(client.get(f"/jobs/{job_id}/events", headers=auth).get_data(as_text=True))
    pieces = [e["data"] for e in events if e["event"] == "output"]
    assert "".join(pieces) == reference["outputs"]["text"]
