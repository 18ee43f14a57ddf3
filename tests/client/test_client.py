"""The Python client against the real service over HTTP: jobs (long-poll and
event-stream waits, a stream cut mid-way, backoff on 429), sync inference,
batches, idempotency, problem details, webhook verification, the address and key
from the environment."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import sqlalchemy as sa

from app import create_app
from app.cards import ModelCard
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.runtime.sessions import SessionPool
from app.tenancy.keys import rotate_webhook_secret
from app.tenancy.tables import Tenant
from app.webhooks import signing
from inference_client import (
    ApiError,
    Batch,
    Client,
    Job,
    WaitTimeout,
    WebhookVerificationError,
    verify_webhook,
)
from tests.client.conftest import CHUNKED
from tests.conftest import TenantAuth, insert_queued_job
from tests.support import live_server, wait_until

RNG = np.random.default_rng(23)


def pixels(rows: int) -> np.ndarray:
    return (RNG.random((rows, 64)) * 16).astype(np.float32)


def direct(model_repository: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the model's file: the reference."""
    return SessionPool("cpu").run(ModelCard.load(model_repository / "digits" / "1"), {"pixels": x})


def assert_outputs_equal(outputs: dict[str, Any], expected: dict[str, np.ndarray]) -> None:
    assert set(outputs) == set(expected)
    for name, reference in expected.items():
        got = np.asarray(outputs[name], dtype=reference.dtype)
        assert np.array_equal(got, reference), name


@pytest.mark.usefixtures("worker")
def test_submit_then_wait_by_long_poll_equals_onnx_runtime(
    api: Client, model_repository: Path
) -> None:
    x = pixels(3)
    submitted = api.jobs.submit("digits", {"pixels": x})
    assert submitted.model == "digits" and submitted.status in ("queued", "running", "succeeded")
    job = api.jobs.wait(submitted.id, timeout=60)
    assert isinstance(job, Job) and job.id == submitted.id
    assert job.succeeded and job.finished and job.error is None, job
    assert job.finished_at is not None and job.created_at is not None
    assert_outputs_equal(job.outputs or {}, direct(model_repository, x))
    # One array for a one-input model: the input is named from the model's metadata.
    bare = api.jobs.submit("digits", x[:1], wait=30)
    if not bare.finished:
        bare = api.jobs.wait(bare.id, timeout=60)
    assert bare.outputs is not None
    assert bare.outputs["label"] == job.outputs["label"][:1]


@pytest.mark.usefixtures("worker")
def test_submit_many_gives_each_input_its_job_or_its_error(
    api: Client, model_repository: Path
) -> None:
    x = pixels(5)
    inputs: list[Any] = [x[0:1], x[1:2], np.zeros((1, 63), np.float32), x[3:5]]
    keys = [f"many-{uuid.uuid4().hex}-{n}" for n in range(4)]
    outcomes = api.jobs.submit_many("digits", inputs, idempotency_keys=keys, per_request=2)
    first, second, short, pair = outcomes
    assert isinstance(short, ApiError) and short.status == 422 and "pixels" in short.errors
    assert all(isinstance(job, Job) for job in (first, second, pair))
    again = api.jobs.submit_many("digits", inputs, idempotency_keys=keys)
    assert [getattr(job, "id", None) for job in again] == [
        getattr(job, "id", None) for job in outcomes
    ]  # a retried call makes no second job
    for job, rows in ((first, x[0:1]), (second, x[1:2]), (pair, x[3:5])):
        assert isinstance(job, Job)
        done = api.jobs.wait(job.id, timeout=60)
        assert done.succeeded, done
        assert_outputs_equal(done.outputs or {}, direct(model_repository, rows))
    with pytest.raises(ValueError, match="one idempotency key"):
        api.jobs.submit_many("digits", inputs, idempotency_keys=keys[:2])


@pytest.mark.usefixtures("worker")
def test_wait_via_the_event_stream_and_resume_after_an_event(
    api: Client, model_repository: Path
) -> None:
    x = pixels(2)
    job = api.jobs.wait(api.jobs.submit("digits", {"pixels": x}).id, via="sse", timeout=60)
    assert job.succeeded, job
    assert_outputs_equal(job.outputs or {}, direct(model_repository, x))

    events = list(api.jobs.events(job.id, timeout=60))
    ids = [e.id for e in events]
    assert all(i is not None for i in ids) and ids == sorted(set(ids))
    assert events[0].type == "job.queued" and events[-1].type == "job.succeeded"
    assert events[-1].job is not None and events[-1].job.outputs == job.outputs
    resumed = list(api.jobs.events(job.id, last_event_id=events[0].id))
    assert [e.id for e in resumed] == ids[1:]
    assert list(api.jobs.events(job.id, last_event_id=events[-1].id)) == []  # all was sent: a 204


class CuttingRelay:
    """A TCP relay to the server that cuts its first connection just after the
    first event of the answer, as a proxy or a network drop would."""

    def __init__(self, base_url: str) -> None:
        self.target = int(base_url.rsplit(":", 1)[1])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent: list[bytearray] = []  # what the client sent, per connection
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target))
        with self._lock:
            self.sent.append(bytearray())
            sent, cut = self.sent[-1], len(self.sent) == 1
        threading.Thread(target=self._forward, args=(client, upstream, sent), daemon=True).start()
        seen = b""
        try:
            while data := upstream.recv(65536):
                if cut:
                    seen += data
                    head = seen.find(b"\r\n\r\n")
                    end = seen.find(b"\n\n", head + 4) if head >= 0 else -1
                    if end >= 0:
                        client.sendall(data[: len(data) - (len(seen) - end - 2)])
                        return
                client.sendall(data)
        except OSError:
            pass
        finally:
            for end in (client, upstream):  # shutdown wakes the forwarding thread's recv
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    @staticmethod
    def _forward(client: socket.socket, upstream: socket.socket, sent: bytearray) -> None:
        try:
            while data := client.recv(65536):
                sent.extend(data)
                upstream.sendall(data)
        except OSError:
            pass


@pytest.mark.usefixtures("worker")
def test_a_cut_event_stream_resumes_after_the_last_event_received(
    base_url: str, api_key: str, model_repository: Path
) -> None:
    x = pixels(1)
    with Client(base_url, api_key) as direct_client:
        submitted = direct_client.jobs.submit("digits", {"pixels": x})
    relay = CuttingRelay(base_url)
    try:
        with Client(relay.url, api_key) as through:
            job = through.jobs.wait(submitted.id, via="sse", timeout=60)
    finally:
        relay.close()
    assert job.succeeded and job.id == submitted.id
    assert_outputs_equal(job.outputs or {}, direct(model_repository, x))
    first, second = bytes(relay.sent[0]), bytes(relay.sent[1])
    assert b"/events" in first and b"last-event-id" not in first.lower()
    # The second connection resumed after the one event the first delivered.
    assert b"/events" in second and b"last-event-id: " in second.lower()


@pytest.mark.usefixtures("worker")
def test_waiting_backs_off_on_429_and_honours_retry_after(
    settings: Settings, database: Database, tenant: TenantAuth, api_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    one_wait = create_app(settings.with_overrides(max_waits_per_tenant=1))
    with live_server(one_wait) as server, Client(server.url, api_key) as limited:
        held = insert_queued_job(database, tenant.id)  # never run: its stream stays open
        stream = requests.get(f"{server.url}/jobs/{held}/events", headers=tenant.headers,
                              stream=True, timeout=30)  # fmt: skip
        assert stream.status_code == 200
        assert next(stream.iter_lines()).startswith(b"id: ")  # the tenant's one wait is held
        job = limited.jobs.submit("digits", {"pixels": pixels(1)})

        with pytest.raises(WaitTimeout) as timed_out:  # Retry-After 1 s is past a 0.5 s budget
            limited.jobs.wait(job.id, timeout=0.5)
        refused = timed_out.value.__cause__
        assert isinstance(refused, ApiError) and refused.status == 429
        assert refused.type == "/problems/too-many-waits" and refused.retry_after == 1.0

        caplog.set_level(logging.WARNING, logger="inference_client")
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(limited.jobs.wait, job.id, 120)

            def backed_off() -> bool:
                assert not waiting.done()
                return any("429" in r.getMessage() for r in caplog.records)

            wait_until(backed_off, "the client to log a 429 and back off", 60, interval=0.1)
            limited.jobs.cancel(str(held))  # its stream ends, and the wait gets its turn
            finished = waiting.result(timeout=120)
        stream.close()
    assert finished.succeeded, finished


def test_cancel_and_the_conflict_after(api: Client, database: Database, tenant: TenantAuth) -> None:
    queued = str(insert_queued_job(database, tenant.id))
    cancelled = api.jobs.cancel(queued)
    assert cancelled.id == queued and cancelled.status == "cancelled" and cancelled.finished
    with pytest.raises(ApiError) as again:
        api.jobs.cancel(queued)
    assert again.value.status == 409 and again.value.type == "/problems/conflict"
    assert queued in again.value.detail or "finished" in again.value.detail
    with pytest.raises(ApiError) as missing:
        api.jobs.get(str(uuid.uuid4()))
    assert missing.value.status == 404 and missing.value.type == "/problems/not-found"


def test_list_follows_the_cursor_across_pages(api: Client) -> None:
    row = pixels(1)
    submitted = [api.jobs.submit("digits", {"pixels": row}, cancel_after=3600).id for _ in range(5)]
    listed = list(api.jobs.list(page_size=2))
    assert [job.id for job in listed] == submitted[::-1]  # newest first, all five
    assert all(job.outputs is None for job in listed)  # outputs only when asked
    only = list(api.jobs.list(model="digits", status="queued", page_size=200))
    assert {job.id for job in only} <= set(submitted)


def test_models_lists_the_models_and_their_metadata(api: Client) -> None:
    listed = {model["name"]: model for model in api.models.list()}
    assert {"digits", "minilm", "smollm2"} <= set(listed)
    assert listed["digits"]["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    metadata = api.models.get("digits", "1")
    assert metadata["name"] == "digits" and metadata["versions"] == ["1"]
    assert [out["name"] for out in metadata["outputs"]] == ["label", "probabilities"]
    assert api.models.input_names("digits") == ["pixels"]
    with pytest.raises(ApiError) as unknown:
        api.models.get("no-such-model")
    assert unknown.value.status == 404


@pytest.mark.usefixtures("worker")
def test_infer_returns_arrays_equal_to_onnx_runtime(api: Client, model_repository: Path) -> None:
    x = pixels(4)
    outputs = api.infer("digits", {"pixels": x}, timeout=30)
    expected = direct(model_repository, x)
    assert set(outputs) == {"label", "probabilities"}
    assert outputs["label"].dtype == np.int64 and outputs["probabilities"].dtype == np.float32
    assert np.array_equal(outputs["label"], expected["label"])
    assert np.array_equal(outputs["probabilities"], expected["probabilities"])
    one = api.infer("digits", x[:1].tolist(), version="1")  # nested lists, one input by name
    assert np.array_equal(one["label"], expected["label"][:1])
    with pytest.raises(ApiError) as unknown:
        api.infer("no-such-model", {"pixels": x})
    assert unknown.value.status == 404 and unknown.value.type == "/problems/unknown-model"


@pytest.mark.usefixtures("worker")
def test_batch_uploads_follows_and_streams_rows_in_order(
    api: Client, model_repository: Path, tmp_path: Path
) -> None:
    x = pixels(100)  # 7 chunks of at most 16 rows
    seen: list[Batch] = []
    results = api.batches.run(CHUNKED, x, on_progress=seen.append, interval=0.2, timeout=180)
    assert results.batch.status == "succeeded" and results.batch.rows_done == 100
    assert seen[-1] is results.batch and all(b.id == results.batch.id for b in seen)
    assert results.batch.chunks == {"succeeded": 7} and results.batch.rows_failed == 0
    rows = list(results)
    assert [r.row for r in rows] == list(range(100)) and all(r.ok for r in rows)
    expected = direct(model_repository, x)
    assert [r.outputs["label"] for r in rows] == expected["label"].tolist()
    probabilities = np.asarray([r.outputs["probabilities"] for r in rows], dtype=np.float32)
    assert np.array_equal(probabilities, expected["probabilities"])

    # The same from a file on disk, read back as one array.
    path = tmp_path / "rows.npy"
    np.save(path, x[:40])
    uploaded = api.files.upload(path)
    assert uploaded.format == "npy" and uploaded.size_bytes == path.stat().st_size
    batch = api.batches.create(CHUNKED, file_id=uploaded.id)
    *_, done = api.batches.follow(batch.id, interval=0.2, timeout=180)
    assert done.finished and done.status == "succeeded", done
    labels = api.batches.array(batch.id, output="label")
    assert np.array_equal(labels, expected["label"][:40])


def test_priority_is_passed_through_only_when_given(api: Client) -> None:
    row = {"pixels": pixels(1)}
    assert api.jobs.submit("digits", row, priority=3, cancel_after=3600).priority == 3
    assert api.jobs.submit("digits", row, cancel_after=3600).priority == 0  # the service's default
    with pytest.raises(ApiError) as over:  # past the tenant's allowance
        api.jobs.submit("digits", row, priority=9)
    assert over.value.status == 422


def test_an_idempotency_key_returns_the_same_job(api: Client) -> None:
    key = f"client-{uuid.uuid4()}"
    inputs = {"pixels": pixels(1)}
    first = api.jobs.submit("digits", inputs, idempotency_key=key, cancel_after=3600)
    again = api.jobs.submit("digits", inputs, idempotency_key=key, cancel_after=3600)
    assert again.id == first.id
    with pytest.raises(ApiError) as other:  # the same key for another request
        api.jobs.submit("digits", {"pixels": pixels(1)}, idempotency_key=key)
    assert other.value.status == 422


def test_errors_carry_the_problem_details(api: Client, base_url: str) -> None:
    with pytest.raises(ApiError) as bad_input:
        api.jobs.submit("digits", {"pixels": [[0.0] * 63]})
    error = bad_input.value
    assert error.status == 422 and error.type == "/problems/invalid-input"
    assert error.title == "Inputs do not match the model"
    assert "expected a FP32 tensor of shape [any, 64]" in error.detail
    assert "pixels" in error.errors and error.problem["expected"][0]["name"] == "pixels"
    assert json.loads(error.body) == error.problem and error.instance == "/jobs"
    assert error.retry_after is None

    with Client(base_url, "ik_not-a-key") as stranger, pytest.raises(ApiError) as unauthorized:
        stranger.jobs.submit("digits", {"pixels": [[0.0] * 64]})
    assert unauthorized.value.status == 401 and unauthorized.value.type == "/problems/unauthorized"
    assert unauthorized.value.title and unauthorized.value.detail


def test_verify_webhook_accepts_the_service_signature_and_refuses_tampering(
    database: Database, tenant: TenantAuth
) -> None:
    with database.sessionmaker() as session:
        row = session.scalars(sa.select(Tenant).where(Tenant.id == tenant.id)).one()
        name, secret = row.name, row.webhook_secret
        event = {"type": "job.succeeded", "timestamp": datetime.now(UTC).isoformat(),
                 "data": {"id": str(uuid.uuid4()), "status": "succeeded"}}  # fmt: skip
        body = json.dumps(event)
        headers = signing.headers(row, f"msg_{uuid.uuid4().hex}", body)
    title_case = {k.title(): v for k, v in headers.items()}  # as an HTTP framework shows them
    assert verify_webhook(body.encode(), title_case, secret) == event

    tampered = body.replace("succeeded", "failed").encode()
    for payload, used_headers, key in [
        (tampered, headers, secret),
        (body.encode(), headers, "whsec_" + "A" * 32),  # another secret
        (body.encode(), {**headers, "webhook-signature": "v1"}, secret),  # malformed
        (body.encode(), {k: v for k, v in headers.items() if k != "webhook-id"}, secret),
    ]:
        with pytest.raises(WebhookVerificationError):
            verify_webhook(payload, used_headers, key)

    with database.sessionmaker() as session:  # during a rotation, either secret verifies
        new_secret = rotate_webhook_secret(session, name, overlap_hours=1)
        session.commit()
        row = session.scalars(sa.select(Tenant).where(Tenant.id == tenant.id)).one()
        rotated = signing.headers(row, "msg_rotated", body)
    assert verify_webhook(body, rotated, secret) == event
    assert verify_webhook(body, rotated, new_secret) == event


def test_wait_gives_up_at_its_timeout_with_the_job_as_it_stands(
    api: Client, database: Database, tenant: TenantAuth
) -> None:
    queued = str(insert_queued_job(database, tenant.id))
    for via in ("poll", "sse"):
        with pytest.raises(WaitTimeout) as timed_out:
            api.jobs.wait(queued, timeout=1.0, via=via)
        if via == "poll":
            assert isinstance(timed_out.value.last, Job) and timed_out.value.last.status == "queued"
    api.jobs.cancel(queued)


@pytest.mark.usefixtures("worker")
def test_without_numpy_the_client_speaks_nested_lists(
    base_url: str, api_key: str, model_repository: Path
) -> None:
    x = pixels(2)
    script = f"""
import json, sys
sys.modules["numpy"] = None  # as if numpy were not installed
from inference_client import Client
with Client({base_url!r}, {api_key!r}) as api:
    outputs = api.infer("digits", {x.tolist()!r})
    job = api.jobs.wait(api.jobs.submit("digits", {{"pixels": {x.tolist()!r}}}).id, timeout=60)
print(json.dumps({{"infer": outputs, "job": job.outputs}}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    expected = direct(model_repository, x)
    assert answer["infer"]["label"] == expected["label"].tolist()
    assert np.array_equal(np.asarray(answer["infer"]["probabilities"], np.float32),
                          expected["probabilities"])  # fmt: skip
    assert answer["job"] == answer["infer"]


def test_the_address_and_key_come_from_the_environment_unless_given(
    base_url: str, api_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_URL", base_url)
    monkeypatch.setenv("INFERENCE_API_KEY", api_key)
    with Client() as from_env:
        assert from_env.base_url == base_url
        job = from_env.jobs.submit("digits", {"pixels": pixels(1)}, cancel_after=3600)

    monkeypatch.setenv("INFERENCE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("INFERENCE_API_KEY", "ik_not-a-key")
    with Client(base_url, api_key) as given:  # arguments win
        assert given.jobs.get(job.id).id == job.id  # the same tenant's key: the env's was taken
    with Client(base_url) as keyed_by_env, pytest.raises(ApiError) as refused:
        keyed_by_env.jobs.submit("digits", {"pixels": pixels(1)})
    assert refused.value.status == 401

    monkeypatch.delenv("INFERENCE_URL")
    monkeypatch.delenv("INFERENCE_API_KEY")
    with Client(api_key=api_key) as local:
        assert local.base_url == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="INFERENCE_API_KEY"):
        Client(base_url)
