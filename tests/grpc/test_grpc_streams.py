"""ModelStreamInfer through `tritonclient.grpc`'s stream: hundreds of requests on
one stream, each answer matched to its request; errors that answer one request
and leave the stream open; bounds per tenant and per stream; a stream cut mid-way
cancels its unfinished jobs and the service goes on."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from sklearn.datasets import load_digits
from sqlalchemy import select
from tritonclient.utils import InferenceServerException

from app.cards import ModelCard
from app.grpc.server import Running
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.sessions import SessionPool
from tests.conftest import TenantAuth, lane_of, make_tenant
from tests.grpc.conftest import FailsOnce
from tests.support import wait_until

ROWS = load_digits().data.astype(np.float32)


def key_of(tenant: TenantAuth) -> dict[str, str]:
    return {"authorization": tenant.headers["Authorization"]}


def row_input(i: int) -> triton.InferInput:
    tensor = triton.InferInput("pixels", [1, 64], "FP32")
    tensor.set_data_from_numpy(ROWS[i : i + 1])
    return tensor


def slow_inputs(seconds: float) -> list[triton.InferInput]:
    x = triton.InferInput("x", [1, 64], "FP32")
    x.set_data_from_numpy(np.full((1, 64), 0.1, np.float32))
    steps = triton.InferInput("steps", [1], "INT64")
    steps.set_data_from_numpy(np.array([int(seconds / 2e-6)], np.int64))
    return [x, steps]


class Answers:
    """What a stream's callback received: results by request id, and errors."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.errors: list[InferenceServerException] = []
        self._lock = threading.Lock()

    def __call__(self, result: Any, error: InferenceServerException | None) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(error)
            else:
                self.results[result.get_response().id] = result

    def count(self) -> int:
        with self._lock:
            return len(self.results) + len(self.errors)


def client_of(running: Running) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{running.port}")


def test_hundreds_of_requests_on_one_stream_each_answered_by_id(
    grpc_server: Running, tenant: TenantAuth, worker: Any, model_repository: Path,
    database: Database,
) -> None:  # fmt: skip
    count = 300
    expected = SessionPool("cpu").run(
        ModelCard.load(model_repository / "digits" / "1"), {"pixels": ROWS[:count]}
    )
    client, answers = client_of(grpc_server), Answers()
    client.start_stream(answers, headers=key_of(tenant))
    for i in range(count):
        client.async_stream_infer("digits", [row_input(i)], request_id=f"row-{i}")
    client.stop_stream()  # ends once every request was answered
    client.close()
    assert not answers.errors, answers.errors[:3]
    assert sorted(answers.results) == sorted(f"row-{i}" for i in range(count))
    job_ids = set()
    for i in range(count):
        result = answers.results[f"row-{i}"]
        assert result.as_numpy("label").tolist() == [expected["label"][i]]
        assert np.array_equal(result.as_numpy("probabilities")[0], expected["probabilities"][i])
        job_ids.add(uuid.UUID(result.get_response().parameters["job_id"].string_param))
    assert len(job_ids) == count  # one call each, with its record (written behind)

    def statuses() -> list[str] | None:
        with database.sessionmaker() as session:
            found = session.scalars(select(Job.status).where(Job.id.in_(job_ids))).all()
        return list(found) if len(found) == count else None

    assert set(wait_until(statuses, "every call's record", 30)) == {"succeeded"}


def test_a_bad_request_is_answered_with_its_id_and_the_stream_goes_on(
    grpc_server: Running, tenant: TenantAuth, worker: Any
) -> None:
    client, answers = client_of(grpc_server), Answers()
    client.start_stream(answers, headers=key_of(tenant))
    wrong = triton.InferInput("pixels", [1, 63], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 63), np.float32))
    client.async_stream_infer("digits", [row_input(0)], request_id="good-1")
    client.async_stream_infer("digits", [wrong], request_id="bad-shape")
    client.async_stream_infer("no-such-model", [row_input(1)], request_id="bad-model")
    client.async_stream_infer("digits", [row_input(2)], request_id="good-2")
    client.stop_stream()
    client.close()
    assert sorted(answers.results) == ["good-1", "good-2"]
    messages = sorted(str(error.message()) for error in answers.errors)
    assert len(messages) == 2, messages
    assert "'bad-model'" in messages[0] and "NOT_FOUND" in messages[0]
    assert "'bad-shape'" in messages[1] and "INVALID_ARGUMENT" in messages[1]
    assert "pixels" in messages[1] and "64" in messages[1]


def test_a_stream_holds_one_of_its_tenants_waits(
    serve_grpc: Callable[..., Running], database: Database, worker: Any
) -> None:
    running = serve_grpc(max_waits_per_tenant=2)
    tenant, other = make_tenant(database), make_tenant(database)
    clients = [client_of(running) for _ in range(4)]
    kept = [Answers() for _ in clients]
    for client, answers in zip(clients[:2], kept, strict=False):
        client.start_stream(answers, headers=key_of(tenant))
        client.async_stream_infer("digits", [row_input(0)], request_id="open")
    wait_until(lambda: all(a.count() for a in kept[:2]), "the first two streams to answer", 30)
    refused = kept[2]
    clients[2].start_stream(refused, headers=key_of(tenant))  # a third: one too many
    wait_until(lambda: refused.errors, "the third stream to be refused", 30)
    assert "RESOURCE_EXHAUSTED" in str(refused.errors[0].status())
    assert "GRPC_MAX_WAITS_PER_TENANT" in str(refused.errors[0].message())
    clients[3].start_stream(kept[3], headers=key_of(other))  # another tenant is not held back
    clients[3].async_stream_infer("digits", [row_input(3)], request_id="other")
    wait_until(lambda: "other" in kept[3].results, "the other tenant's answer", 30)
    for client in clients:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_requests_beyond_the_in_flight_bound_wait_their_turn(
    serve_grpc: Callable[..., Running], tenant: TenantAuth, worker: Any
) -> None:
    running = serve_grpc(grpc_stream_max_in_flight=2)
    client, answers = client_of(running), Answers()
    client.start_stream(answers, headers=key_of(tenant))
    for i in range(40):
        client.async_stream_infer("digits", [row_input(i)], request_id=f"r{i}")
    client.stop_stream()
    client.close()
    assert not answers.errors and len(answers.results) == 40


def test_a_stream_cut_mid_way_withdraws_its_waiting_calls(
    grpc_server: Running, tenant: TenantAuth, worker: Any, database: Database,
    settings: Settings,
) -> None:  # fmt: skip
    client, answers = client_of(grpc_server), Answers()
    client.start_stream(answers, headers=key_of(tenant))
    for i in range(6):  # about 2 s each; the worker runs two at a time
        client.async_stream_infer("slow", slow_inputs(2.0), request_id=f"slow-{i}")
    lane = lane_of(settings)
    wait_until(lambda: lane.waiting("slow") == 4, "two calls taken, four waiting", 30)
    client.stop_stream(cancel_requests=True)  # the client goes away mid-way
    client.close()
    wait_until(lambda: lane.waiting("slow") == 0, "the waiting calls withdrawn", 30)

    def records() -> list[Job]:
        with database.sessionmaker() as session:
            query = select(Job).where(Job.tenant_id == tenant.id, Job.model == "slow")
            return list(session.scalars(query))

    wait_until(lambda: len(records()) == 2, "the two taken calls' records", 30)
    time.sleep(2.5)  # long enough for another slow call to have run: none did
    assert len(records()) == 2 and len(answers.results) < 6
    # The service is unaffected: a new stream and a unary call are answered.
    fresh = client_of(grpc_server)
    result = fresh.infer("digits", [row_input(5)], headers=key_of(tenant))
    assert result.as_numpy("label").shape == (1,)
    fresh.close()


def test_a_tenant_holds_at_most_its_share_of_streams(
    serve_grpc: Callable[..., Running], database: Database, worker: Any
) -> None:
    running = serve_grpc(grpc_max_streams_per_tenant=1)
    tenant = make_tenant(database)
    first, second = client_of(running), client_of(running)
    kept, refused = Answers(), Answers()
    first.start_stream(kept, headers=key_of(tenant))
    first.async_stream_infer("digits", [row_input(0)], request_id="open")
    wait_until(lambda: kept.count(), "the first stream's answer", 30)
    second.start_stream(refused, headers=key_of(tenant))
    wait_until(lambda: refused.errors, "the second stream to be refused", 30)
    assert "RESOURCE_EXHAUSTED" in str(refused.errors[0].status())
    assert "GRPC_MAX_STREAMS_PER_TENANT" in str(refused.errors[0].message())
    for client in (first, second):
        client.stop_stream(cancel_requests=True)
        client.close()


def test_a_small_byte_budget_still_lets_every_request_through(
    serve_grpc: Callable[..., Running], tenant: TenantAuth, worker: Any
) -> None:
    running = serve_grpc(grpc_stream_max_in_flight_bytes=1024)  # about three requests
    client, answers = client_of(running), Answers()
    client.start_stream(answers, headers=key_of(tenant))
    for i in range(30):
        client.async_stream_infer("digits", [row_input(i)], request_id=f"r{i}")
    client.stop_stream()
    client.close()
    assert not answers.errors and len(answers.results) == 30


def test_an_unexpected_error_answers_its_request_internal_and_the_stream_goes_on(
    serve_grpc: Callable[..., Running], tenant: TenantAuth, worker: Any,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The call operations fail unexpectedly while starting one request: that request
    is answered INTERNAL with a reference and nothing of the error, and the next
    request on the same stream is answered."""
    running = serve_grpc()
    plane = running.container.calls
    broken = FailsOnce(plane.start_calls)
    monkeypatch.setattr(plane, "start_calls", broken)
    client, answers = client_of(running), Answers()
    client.start_stream(answers, headers=key_of(tenant))
    with caplog.at_level("ERROR", logger="app.grpc.status"):
        client.async_stream_infer("digits", [row_input(0)], request_id="boom")
        wait_until(answers.count, "the failed request's answer", 30)
    client.async_stream_infer("digits", [row_input(1)], request_id="after")
    client.stop_stream()
    client.close()
    assert broken.calls == 2 and list(answers.results) == ["after"]
    assert answers.results["after"].as_numpy("label").shape == (1,)
    [error] = answers.errors
    message = str(error.message())
    assert message.startswith("request 'boom': INTERNAL: internal error (reference "), message
    assert not [part for part in FailsOnce.INTERNALS if part in message], message
    reference = message.split("reference ")[1].split(")")[0]
    [logged] = [r for r in caplog.records if reference in r.getMessage()]
    assert logged.exc_info is not None and str(logged.exc_info[1]) == FailsOnce.SECRET


def test_a_stream_that_cannot_start_ends_internal_and_the_next_one_works(
    serve_grpc: Callable[..., Running], tenant: TenantAuth, worker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The call operations fail unexpectedly as a stream opens: the stream ends with
    status INTERNAL and nothing of the error; a new stream on the same client is
    served, and the tenant's wait the failed one held was given back."""
    running = serve_grpc(grpc_max_streams_per_tenant=1)
    plane = running.container.calls
    broken = FailsOnce(plane.follow_calls)
    monkeypatch.setattr(plane, "follow_calls", broken)
    client, failed = client_of(running), Answers()
    client.start_stream(failed, headers=key_of(tenant))
    wait_until(lambda: failed.errors, "the stream to fail", 30)
    [error] = failed.errors
    assert str(error.status()) == "StatusCode.INTERNAL", error
    message = str(error.message())
    assert "internal error (reference " in message, message
    assert not [part for part in FailsOnce.INTERNALS if part in message], message
    client.stop_stream()
    answers = Answers()
    client.start_stream(answers, headers=key_of(tenant))
    client.async_stream_infer("digits", [row_input(2)], request_id="next")
    client.stop_stream()
    client.close()
    assert broken.calls == 2 and not answers.errors and list(answers.results) == ["next"]
