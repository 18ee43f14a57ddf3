"""Webhooks end to end: a real HTTP receiver on loopback, scripted to misbehave,
a real webhook worker process, every delivery verified with `standardwebhooks`."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import text
from standardwebhooks import Webhook

from app import create_app
from app.operations.webhooks import WebhookOperations
from app.platform.database import Database
from app.platform.settings import Settings
from app.tenancy.keys import rotate_webhook_secret
from app.tenancy.tables import Tenant
from app.web.context import container_of
from app.webhooks import delivery, retry_after, signing, transport
from app.webhooks.delivery import DeliverySettings
from app.webhooks.receiver import DuplicateDelivery, Receiver, WebhookVerificationError
from tests.conftest import TenantAuth, WorkerProcess, make_tenant, wait_for_job
from tests.faults.clock import skewed_datetime
from tests.support import starts_processes, wait_until

BODY = {"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}
SCHEDULE = "0,0.2,0.2,0.2,2.5"  # five attempts, quickly; Retry-After is honoured up to 2.5 s


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    body_bytes: int = 0  # a body of this many bytes, as fast as the sender reads it...
    byte_every: float = 0.0  # ...or one byte every this many seconds
    trickle_headers: bool = False  # the status line and headers, one byte every 20 ms
    on_request: Callable[[], None] | None = None  # called as the request arrives


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedReceiver:
    """Answers each path with its script, one reply per request (the last repeats)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.scripts: dict[str, list[Reply]] = {}
        self.received: list[Received] = []
        self.sent: dict[str, list[int]] = {}  # body bytes written, per reply
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(Received(self.path, dict(self.headers), body))
                script = receiver.scripts.get(self.path, [Reply()])
                reply = script.pop(0) if len(script) > 1 else script[0]
                if reply.on_request is not None:
                    reply.on_request()
                time.sleep(reply.delay)
                with contextlib.suppress(OSError):  # the sender gave up, or read enough
                    self.answer(reply)

            def answer(self, reply: Reply) -> None:
                if reply.trickle_headers:
                    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 2000:
                        self.wfile.write(bytes([byte]))
                        time.sleep(0.02)
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(reply.body_bytes))
                self.end_headers()
                sent = receiver.sent.setdefault(self.path, [])
                sent.append(0)
                chunk = b"x" if reply.byte_every else b"x" * 65536
                while sent[-1] < reply.body_bytes:
                    self.wfile.write(chunk[: reply.body_bytes - sent[-1]])
                    sent[-1] += len(chunk[: reply.body_bytes - sent[-1]])
                    time.sleep(reply.byte_every)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://{host}:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]


@pytest.fixture(scope="module")
def receiver() -> Iterator[ScriptedReceiver]:
    scripted = ScriptedReceiver()
    yield scripted
    scripted.server.shutdown()


@pytest.fixture(scope="module")
def hooks(settings: Settings) -> Settings:
    return settings.with_overrides(
        webhooks_queue=f"{settings.jobs_queue}-webhooks",
        webhook_allow_private_networks=True,
        webhook_timeout_seconds=1.0,
        webhook_retry_schedule=tuple(float(x) for x in SCHEDULE.split(",")),
    )


def start_webhook_worker(hooks: Settings, log: Path) -> WorkerProcess:
    return WorkerProcess(
        hooks.with_overrides(jobs_queue=hooks.webhooks_queue), log, concurrency=4,
        WEBHOOKS_QUEUE=hooks.webhooks_queue, WEBHOOK_ALLOW_PRIVATE_NETWORKS="true",
        WEBHOOK_TIMEOUT_SECONDS="1", WEBHOOK_RETRY_SCHEDULE=SCHEDULE,
    )  # fmt: skip


@pytest.fixture(scope="module")
@starts_processes
def webhook_worker(
    hooks: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = start_webhook_worker(hooks, tmp_path_factory.mktemp("hooks") / "worker.log")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def app_(hooks: Settings, worker: Any, webhook_worker: WorkerProcess) -> Flask:
    return create_app(hooks)


def sender(database: Database, settings: Settings) -> WebhookOperations:
    """The webhook operations of a worker with these settings, over `database`."""
    return WebhookOperations(database, DeliverySettings.of(settings))


def deliver(database: Database, settings: Settings, delivery_id: int) -> str | None:
    """One attempt of a delivery, as a webhook sender's task makes it (its own scope)."""
    with database.scope():
        return sender(database, settings).deliver(delivery_id)


def take_due(app: Flask, settings: Settings) -> list[int]:
    """What beat's webhook sweep marks `sending` (the test then sends them)."""
    container = container_of(app)
    with container.scope():
        return sender(container.parts.database, settings).send_due(lambda _id: None)


def pump(app: Flask, until: Callable[[], bool], timeout: float = 30) -> None:
    """Run the webhook sweep (what beat does every second) until `until()` holds."""

    def swept() -> bool:
        if until():
            return True
        settings = container_of(app).settings
        for delivery_id in take_due(app, settings):
            container_of(app).parts.celery.send_task(
                delivery.DELIVER_TASK, args=[delivery_id], queue=settings.webhooks_queue
            )
        return False

    wait_until(swept, "the deliveries' condition, sweeping as beat does", timeout, interval=0.1)


def secret_of(database: Database, tenant: TenantAuth) -> str:
    with database.sessionmaker() as session:
        row = session.get(Tenant, tenant.id)
        assert row is not None
        return row.webhook_secret


def submit(app: Flask, tenant: TenantAuth, url: str, **webhook: Any) -> dict[str, Any]:
    response = app.test_client().post(
        "/jobs", json={**BODY, "webhook": {"url": url, **webhook}}, headers=tenant.headers
    )
    assert response.status_code == 202, response.json
    job: dict[str, Any] = response.json
    return job


def deliveries(app: Flask, tenant: TenantAuth, job_id: str) -> list[dict[str, Any]]:
    response = app.test_client().get(f"/jobs/{job_id}/deliveries", headers=tenant.headers)
    assert response.status_code == 200, response.json
    items: list[dict[str, Any]] = response.json["items"]
    return items


def verified(secret: str, received: Received) -> dict[str, Any]:
    payload: dict[str, Any] = Webhook(secret).verify(received.body, received.headers)
    return payload


def test_terminal_event_delivered_signed_and_logged(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, database: Database
) -> None:
    job = submit(app_, tenant, f"{receiver.base}/ok")
    assert job["webhook"] == {"url": f"{receiver.base}/ok", "events": [
        "job.succeeded", "job.failed", "job.cancelled", "job.expired"]}  # fmt: skip
    done = wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: len(receiver.at("/ok")) >= 1)
    event = verified(secret_of(database, tenant), receiver.at("/ok")[0])
    assert event["type"] == "job.succeeded" and event["data"] == done
    # The receiver has the POST a moment before the sender has recorded its answer.
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    [logged] = deliveries(app_, tenant, job["id"])
    assert logged["status"] == "delivered" and logged["message_id"].startswith("msg_")
    assert receiver.at("/ok")[0].headers["webhook-id"] == logged["message_id"]
    assert [a["status_code"] for a in logged["log"]] == [200]
    assert logged["log"][0]["latency_ms"] > 0


def test_500_three_times_then_200_is_one_event_retried(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, database: Database
) -> None:
    receiver.scripts["/flaky"] = [Reply(500), Reply(500), Reply(500), Reply(200)]
    job = submit(app_, tenant, f"{receiver.base}/flaky", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    hits = receiver.at("/flaky")
    assert len(hits) == 4 and len({h.headers["webhook-id"] for h in hits}) == 1
    assert len({h.body for h in hits}) == 1, "every retry sends the same body"
    secret = secret_of(database, tenant)
    assert all(verified(secret, h)["type"] == "job.succeeded" for h in hits)
    log = deliveries(app_, tenant, job["id"])[0]["log"]
    assert [a["status_code"] for a in log] == [500, 500, 500, 200]


def test_a_hanging_receiver_and_a_redirect_are_failed_attempts(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    receiver.scripts["/slow"] = [Reply(200, delay=2.5), Reply(301, {"Location": "/elsewhere"}),
                                 Reply(200)]  # fmt: skip
    job = submit(app_, tenant, f"{receiver.base}/slow", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    log = deliveries(app_, tenant, job["id"])[0]["log"]
    assert log[0]["error"] == "timed out" and log[0]["status_code"] is None
    assert log[1]["status_code"] == 301 and log[1]["error"] == "redirect not followed"
    assert log[2]["status_code"] == 200
    assert receiver.at("/elsewhere") == []


def test_410_disables_the_url_for_the_tenant(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, database: Database
) -> None:
    receiver.scripts["/gone"] = [Reply(410)]
    first = submit(app_, tenant, f"{receiver.base}/gone", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, first["id"])
    pump(app_, lambda: deliveries(app_, tenant, first["id"])[0]["status"] == "disabled")
    second = submit(app_, tenant, f"{receiver.base}/gone", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, second["id"])
    pump(app_, lambda: deliveries(app_, tenant, second["id"])[0]["status"] == "disabled")
    assert len(receiver.at("/gone")) == 1, "nothing more is sent to a URL that answered 410"
    assert "410" in deliveries(app_, tenant, second["id"])[0]["log"][0]["error"]
    redeliver = app_.test_client().post(
        f"/jobs/{second['id']}/deliveries/{deliveries(app_, tenant, second['id'])[0]['id']}"
        "/redeliver", headers=tenant.headers)  # fmt: skip
    assert redeliver.status_code == 409
    other = make_tenant(database)  # another tenant may still use that URL
    theirs = submit(app_, other, f"{receiver.base}/gone", events=["job.succeeded"])
    wait_for_job(app_.test_client(), other.headers, theirs["id"])
    pump(app_, lambda: len(receiver.at("/gone")) == 2)


def test_429_retry_after_is_honoured(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    receiver.scripts["/busy"] = [Reply(429, {"Retry-After": "2"}), Reply(200)]
    job = submit(app_, tenant, f"{receiver.base}/busy", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["log"] != [])
    [pending] = deliveries(app_, tenant, job["id"])
    from datetime import datetime

    first_try = datetime.fromisoformat(pending["log"][0]["at"])
    assert (datetime.fromisoformat(pending["next_attempt_at"]) - first_try).total_seconds() >= 1.9
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")


def test_a_used_up_schedule_is_a_dead_letter_that_replays(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    receiver.scripts["/down"] = [Reply(503)] * 5 + [Reply(200)]
    job = submit(app_, tenant, f"{receiver.base}/down", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "failed")
    client = app_.test_client()
    letters = client.get("/dead-letters?error_code=webhook_undeliverable", headers=tenant.headers)
    [letter] = [x for x in letters.json["items"] if x["job_id"] == job["id"]]
    assert letter["attempts"] == 5 and "HTTP 503" in letter["message"]
    assert (
        client.post(f"/dead-letters/{letter['id']}/replay", headers=tenant.headers).status_code
        == 202
    )
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    assert len(receiver.at("/down")) == 6
    assert client.get(f"/jobs/{job['id']}", headers=tenant.headers).json["status"] == "succeeded"


def test_redeliver_sends_the_same_event_again(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    job = submit(app_, tenant, f"{receiver.base}/again", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: len(receiver.at("/again")) == 1)
    [first] = deliveries(app_, tenant, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    response = app_.test_client().post(
        f"/jobs/{job['id']}/deliveries/{first['id']}/redeliver", headers=tenant.headers
    )
    assert response.status_code == 202
    pump(app_, lambda: len(receiver.at("/again")) == 2)
    assert len({h.headers["webhook-id"] for h in receiver.at("/again")}) == 1


def test_every_event_when_asked_and_secret_rotation(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, database: Database
) -> None:
    old = secret_of(database, tenant)
    with database.sessionmaker.begin() as session:
        new = rotate_webhook_secret(session, next(
            t.name for t in session.query(Tenant).filter(Tenant.id == tenant.id)), 1)  # fmt: skip
    job = submit(app_, tenant, f"{receiver.base}/all",
                 events=["job.queued", "job.running", "job.succeeded"])  # fmt: skip
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: len(receiver.at("/all")) == 3)
    hits = receiver.at("/all")
    types = sorted(verified(new, h)["type"] for h in hits)
    assert types == ["job.queued", "job.running", "job.succeeded"]
    assert all(verified(old, h) for h in hits), "during the overlap the old secret verifies too"
    assert all(len(h.headers["webhook-signature"].split(" ")) == 2 for h in hits)


def test_a_killed_webhook_worker_loses_no_event(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    webhook_worker: WorkerProcess, tmp_path: Path,
) -> None:  # fmt: skip
    receiver.scripts["/crash"] = [Reply(200, delay=3), Reply(200)]
    job = submit(app_, tenant, f"{receiver.base}/crash", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: len(receiver.at("/crash")) == 1)  # the worker is waiting for an answer
    webhook_worker.proc.kill()
    webhook_worker.proc.wait()
    replacement = start_webhook_worker(hooks, tmp_path / "replacement.log")
    try:
        pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    finally:
        replacement.stop()
        webhook_worker.__init__(  # type: ignore[misc]
            hooks.with_overrides(jobs_queue=hooks.webhooks_queue), webhook_worker.log_path, 4,
            WEBHOOKS_QUEUE=hooks.webhooks_queue, WEBHOOK_ALLOW_PRIVATE_NETWORKS="true",
            WEBHOOK_TIMEOUT_SECONDS="1", WEBHOOK_RETRY_SCHEDULE=SCHEDULE)  # fmt: skip
    hits = receiver.at("/crash")
    assert len(hits) == 2 and hits[0].headers["webhook-id"] == hits[1].headers["webhook-id"]


def test_receiver_helper_verifies_and_deduplicates(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, database: Database
) -> None:
    job = submit(app_, tenant, f"{receiver.base}/helper", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: len(receiver.at("/helper")) == 1)
    hit = receiver.at("/helper")[0]
    helper = Receiver(secret_of(database, tenant))
    assert helper.receive(hit.body, hit.headers)["data"]["id"] == job["id"]
    with pytest.raises(DuplicateDelivery):
        helper.receive(hit.body, hit.headers)
    with pytest.raises(WebhookVerificationError):
        Receiver(secret_of(database, tenant)).receive(hit.body.replace(b"succeeded", b"failed"),
                                                      hit.headers)  # fmt: skip
    assert json.loads(hit.body)["type"] == "job.succeeded"


def test_the_url_is_checked_again_at_delivery(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings
) -> None:
    """Accepted while private networks were allowed; a worker that refuses them does
    not send, and the delivery ends as a dead letter instead of being retried."""
    job = submit(app_, tenant, f"{receiver.base}/inside", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    strict = hooks.with_overrides(webhook_allow_private_networks=False)
    due = take_due(app_, strict)
    [mine] = [d for d in deliveries(app_, tenant, job["id"]) if d["id"] in due]
    assert deliver(container_of(app_).parts.database, strict, mine["id"]) == "failed"
    assert receiver.at("/inside") == []
    [logged] = deliveries(app_, tenant, job["id"])
    assert "not a public address" in logged["log"][0]["error"]
    letters = app_.test_client().get("/dead-letters?error_code=webhook_undeliverable",
                                     headers=tenant.headers).json["items"]  # fmt: skip
    assert any(x["job_id"] == job["id"] for x in letters)


# Receivers that try to stall, crash or redirect the sender. Where a test must step
# between the phases of one attempt it runs the delivery code in this process; the
# only fake is the resolver, where a test needs DNS to lie.

MiB = 1024 * 1024


def done_job(app: Flask, tenant: TenantAuth, url: str) -> int:
    """Submit a job with a webhook to `url`, wait for it; its delivery's id."""
    job = submit(app, tenant, url, events=["job.succeeded"])
    wait_for_job(app.test_client(), tenant.headers, job["id"])
    [mine] = deliveries(app, tenant, job["id"])
    return int(mine["id"])


def take(app: Flask, settings: Settings, delivery_id: int) -> bool:
    """One sweep: whether it marked `delivery_id` sending. Others it took go to the worker."""
    ids = take_due(app, settings)
    for other in ids:
        if other != delivery_id:
            container_of(app).parts.celery.send_task(
                delivery.DELIVER_TASK, args=[other], queue=settings.webhooks_queue
            )
    return delivery_id in ids


def expire_lease(database: Database, delivery_id: int) -> None:
    """Time passes: the delivery's lease runs out (a message late in the queue, a stall)."""
    with database.sessionmaker() as session:
        session.execute(
            text("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' "
                 "WHERE id = :id"), {"id": delivery_id})  # fmt: skip
        session.commit()


def in_thread(database: Database, settings: Settings, delivery_id: int) -> tuple[
    threading.Thread, dict[str, str | None]
]:  # fmt: skip
    result: dict[str, str | None] = {}

    def send() -> None:
        result["status"] = deliver(database, settings, delivery_id)

    thread = threading.Thread(target=send)
    thread.start()
    return thread, result


# 1. Stalling and flooding: one wall-clock budget per attempt, a capped read.


def test_a_trickling_receiver_is_cut_off_at_the_attempts_budget(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    """WEBHOOK_TIMEOUT_SECONDS is 1: each byte comes well within it, the whole never does."""
    receiver.scripts["/trickle-head"] = [Reply(trickle_headers=True), Reply(200)]
    receiver.scripts["/trickle-body"] = [Reply(200, body_bytes=1000, byte_every=0.1)]
    head = submit(app_, tenant, f"{receiver.base}/trickle-head", events=["job.succeeded"])
    body = submit(app_, tenant, f"{receiver.base}/trickle-body", events=["job.succeeded"])
    for job in (head, body):
        wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: all(deliveries(app_, tenant, j["id"])[0]["status"] == "delivered"
                           for j in (head, body)))  # fmt: skip
    [cut, ok] = deliveries(app_, tenant, head["id"])[0]["log"]
    assert cut["status_code"] is None and cut["error"] == "timed out"
    assert cut["latency_ms"] < 2500 and ok["status_code"] == 200
    [answered] = deliveries(app_, tenant, body["id"])[0]["log"]
    assert answered["status_code"] == 200 and answered["latency_ms"] < 2500


def test_a_flood_of_a_body_is_not_read(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    receiver.scripts["/flood"] = [Reply(500, body_bytes=256 * MiB), Reply(200)]
    job = submit(app_, tenant, f"{receiver.base}/flood", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    assert [a["status_code"] for a in deliveries(app_, tenant, job["id"])[0]["log"]] == [500, 200]
    wait_until(lambda: len(receiver.sent["/flood"]) == 2, "the second reply to be sent", 10)
    assert receiver.sent["/flood"][0] < 16 * MiB, "the sender stopped reading and hung up"


# 2. What the delivery log tells a tenant, and where the POST goes.


def test_the_log_names_no_address(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    job = submit(app_, tenant, f"http://127.0.0.1:{port}/nobody", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "failed")
    log = deliveries(app_, tenant, job["id"])[0]["log"]
    assert [a["error"] for a in log] == ["connection refused"] * 5
    letters = app_.test_client().get("/dead-letters?error_code=webhook_undeliverable",
                                     headers=tenant.headers).json["items"]  # fmt: skip
    [letter] = [x for x in letters if x["job_id"] == job["id"]]
    assert letter["message"].endswith(": connection refused")


def test_dns_rebinding_reaches_only_the_checked_address(
    app_: Flask, tenant: TenantAuth, hooks: Settings, database: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """`rebind.test` answers 127.0.0.2 (allowed: the stand-in for a public address)
    to the first lookup of the attempt and 127.0.0.1 (the private network) to every
    later one."""
    public = ScriptedReceiver("127.0.0.2")
    try:
        internal = ScriptedReceiver("127.0.0.1", public.port)
    except OSError:
        public.server.shutdown()
        pytest.skip("the port is taken on 127.0.0.1")
    real, lookups = socket.getaddrinfo, []

    def lying(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        address = "127.0.0.2" if len(lookups) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", lying)
    delivery_id = done_job(app_, tenant, f"http://rebind.test:{public.port}/hook")
    lookups.clear()  # the check at submit saw 127.0.0.2 too
    strict = hooks.with_overrides(
        webhook_allow_private_networks=False, webhook_allowed_networks=("127.0.0.2/32",)
    )
    try:
        assert take(app_, strict, delivery_id)
        assert deliver(database, strict, delivery_id) == "delivered"
    finally:
        public.server.shutdown()
        internal.server.shutdown()
    assert internal.received == [], "nothing was sent into the private network"
    [hit] = public.at("/hook")
    assert hit.headers["Host"] == f"rebind.test:{public.port}" and len(lookups) == 1


def test_an_egress_proxy_carries_every_delivery(
    app_: Flask, tenant: TenantAuth, hooks: Settings, database: Database
) -> None:
    """With WEBHOOK_PROXY_URL the proxy resolves and connects (and enforces egress)."""
    proxy = ScriptedReceiver()
    url = "http://localhost:9/via-proxy"  # nothing listens there; only the proxy may call it
    delivery_id = done_job(app_, tenant, url)
    proxied = hooks.with_overrides(
        webhook_allow_private_networks=False, webhook_proxy_url=proxy.base
    )
    try:
        assert take(app_, proxied, delivery_id)
        assert deliver(database, proxied, delivery_id) == "delivered"
    finally:
        proxy.server.shutdown()
    [hit] = proxy.received
    assert hit.path == url and hit.headers["Host"] == "localhost:9"


def test_proxy_settings_of_the_environment_are_ignored(
    hooks: Settings, receiver: ScriptedReceiver, tenant: TenantAuth, tmp_path: Path,
    webhook_worker: WorkerProcess, make_app: Callable[..., Flask],
) -> None:  # fmt: skip
    """A worker started with HTTP_PROXY in its environment still connects directly."""
    trap = ScriptedReceiver()
    queue = f"{hooks.webhooks_queue}-env"
    settings = hooks.with_overrides(webhooks_queue=queue)
    app = make_app(settings)
    worker = WorkerProcess(
        settings.with_overrides(jobs_queue=queue), tmp_path / "env.log", 1,
        WEBHOOKS_QUEUE=queue, WEBHOOK_ALLOW_PRIVATE_NETWORKS="true", WEBHOOK_TIMEOUT_SECONDS="1",
        HTTP_PROXY=trap.base, HTTPS_PROXY=trap.base, http_proxy=trap.base, NO_PROXY="",
        no_proxy="",
    )  # fmt: skip
    try:
        job = submit(app, tenant, f"{receiver.base}/direct", events=["job.succeeded"])
        wait_for_job(app.test_client(), tenant.headers, job["id"])
        pump(app, lambda: deliveries(app, tenant, job["id"])[0]["log"] != [])
    finally:
        worker.stop()
        trap.server.shutdown()
    assert trap.received == [] and len(receiver.at("/direct")) == 1


# 3. Leases and guarded writes.


def test_the_lease_starts_when_a_sender_takes_the_delivery(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database,
) -> None:  # fmt: skip
    """Its message waited in the queue longer than the lease the sweep gave it: the
    sweep must not take it back while it is being sent. (A retry: its payload is
    written already, so the sender holds no row lock that would hide the bug.)"""
    slow = hooks.with_overrides(webhook_timeout_seconds=3.0)
    receiver.scripts["/late-message"] = [Reply(500), Reply(200, delay=1.0)]
    delivery_id = done_job(app_, tenant, f"{receiver.base}/late-message")
    assert take(app_, slow, delivery_id)
    assert deliver(database, slow, delivery_id) == "pending"
    wait_until(lambda: take(app_, slow, delivery_id), "the retry to be due and taken", 10)
    expire_lease(database, delivery_id)  # the message sat in the queue
    thread, result = in_thread(database, slow, delivery_id)
    wait_until(lambda: len(receiver.at("/late-message")) == 2, "the retry's POST", 10)
    retaken = take(app_, slow, delivery_id)  # the sweep, while the POST is under way
    thread.join()
    assert not retaken and result["status"] == "delivered"
    assert len(receiver.at("/late-message")) == 2


def test_a_sender_that_lost_its_lease_writes_nothing(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database,
) -> None:  # fmt: skip
    """A stalls past its lease mid-POST; the sweep hands the delivery to B, whose 200
    is recorded; A's late 500 must not overwrite status or attempt count."""
    slow = hooks.with_overrides(webhook_timeout_seconds=3.0)
    receiver.scripts["/stalled"] = [Reply(500, delay=1.0), Reply(200)]
    delivery_id = done_job(app_, tenant, f"{receiver.base}/stalled")
    assert take(app_, slow, delivery_id)
    thread, late = in_thread(database, slow, delivery_id)
    wait_until(lambda: len(receiver.at("/stalled")) == 1, "A's POST", 10)
    expire_lease(database, delivery_id)  # A stalls
    assert take(app_, slow, delivery_id)
    assert deliver(database, slow, delivery_id) == "delivered"
    thread.join()
    assert late["status"] is None
    with database.sessionmaker() as session:
        row = session.execute(text("SELECT status, attempts FROM webhook_deliveries "
                                   "WHERE id = :id"), {"id": delivery_id}).one()  # fmt: skip
    assert (row.status, row.attempts) == ("delivered", 1)


# 4. Retry-After.


def test_a_hostile_retry_after_is_one_recorded_attempt_each(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth
) -> None:
    receiver.scripts["/retry-after"] = [
        Reply(429, {"Retry-After": "\u00b2"}),  # a digit to str.isdigit, not to HTTP
        Reply(503, {"Retry-After": "9" * 400}),  # no float holds it
        Reply(429, {"Retry-After": "250000000000"}),  # about 8000 years
        Reply(503, {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}),
        Reply(200),
    ]
    job = submit(app_, tenant, f"{receiver.base}/retry-after", events=["job.succeeded"])
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    log = deliveries(app_, tenant, job["id"])[0]["log"]
    assert [a["status_code"] for a in log] == [429, 503, 429, 503, 200]


@pytest.mark.parametrize(
    ("header", "expected"),
    [("120", 120.0), (" 7 ", 7.0), ("99999999999999999999", 3600.0), ("250000000000", 3600.0),
     ("\u00b2", None), ("\u0663", None), ("-5", None), ("1e3", None), ("soon", None), ("", None),
     ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("Fri, 31 Dec 9999 23:59:59 GMT", 3600.0)],
)  # fmt: skip
def test_retry_after_is_parsed_and_clamped(header: str, expected: float | None) -> None:
    assert retry_after.seconds(header, 3600.0) == expected


# 5. No transaction held during the POST.


def test_no_transaction_is_open_while_the_receiver_answers(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    observed: list[bool] = []
    post = transport.post

    def posting(*args: Any, **kwargs: Any) -> transport.Answer:
        observed.append(database.session().in_transaction())  # the sender's, in its thread
        return post(*args, **kwargs)

    monkeypatch.setattr(transport, "post", posting)
    delivery_id = done_job(app_, tenant, f"{receiver.base}/no-transaction")
    assert take(app_, hooks, delivery_id)
    assert deliver(database, hooks, delivery_id) == "delivered"
    assert observed == [False]


def test_the_workers_log_names_no_path_or_token_of_a_webhook_url(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, webhook_worker: WorkerProcess
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    job = submit(app_, tenant, f"{receiver.base}/hook/{token}?sig={token}")
    wait_for_job(app_.test_client(), tenant.headers, job["id"])
    pump(app_, lambda: any(token in r.path for r in receiver.received))
    pump(app_, lambda: deliveries(app_, tenant, job["id"])[0]["status"] == "delivered")
    log = webhook_worker.log_path.read_text(errors="replace")
    assert f"{receiver.base}/..." in log  # the delivery was logged, by its origin only
    assert token not in log


# 6. The sender's clock.


def test_a_sender_an_hour_ahead_retries_and_signs_by_the_databases_clock(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The sender's wall clock is an hour ahead (what app.webhooks reads of it, as the
    fault suite skews it): its 503's retry is due after the schedule's step by
    PostgreSQL's now(), not an hour later, and a receiver accepts its signatures."""
    for module in (delivery, signing, retry_after):
        monkeypatch.setattr(module, "datetime", skewed_datetime(3600))
    receiver.scripts["/skewed"] = [Reply(503), Reply(200)]
    delivery_id = done_job(app_, tenant, f"{receiver.base}/skewed")
    assert take(app_, hooks, delivery_id)
    assert deliver(database, hooks, delivery_id) == "pending"
    with database.sessionmaker() as session:
        due_in = session.scalar(
            text("SELECT extract(epoch FROM next_attempt_at - now()) FROM webhook_deliveries "
                 "WHERE id = :id"), {"id": delivery_id},
        )  # fmt: skip
    assert due_in is not None and float(due_in) <= hooks.webhook_retry_schedule[1] * 1.1
    wait_until(lambda: take(app_, hooks, delivery_id), "the retry to be due and taken", 10)
    assert deliver(database, hooks, delivery_id) == "delivered"
    secret = secret_of(database, tenant)
    for received in receiver.at("/skewed"):
        assert verified(secret, received)["type"] == "job.succeeded"


# 7. A URL failing for WEBHOOK_DISABLE_AFTER_SECONDS is disabled. Attempts run in this
# process with the limit set; the time a URL has been failing is staged in the database
# (its failing_since moved back), the only clock the rule reads.

LIMIT = 3600.0


def stage(database: Database, statement: str, **values: Any) -> None:
    with database.sessionmaker() as session:
        session.execute(text(statement), values)
        session.commit()


def parked(database: Database, delivery_id: int) -> int:
    """The delivery, due only in an hour: no sweep sends it until a test asks."""
    stage(database, "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour' "
          "WHERE id = :id AND status = 'pending'", id=delivery_id)  # fmt: skip
    return delivery_id


def attempt(app: Flask, settings: Settings, database: Database, delivery_id: int) -> str | None:
    """Make the delivery due, take it and make its attempt here; a retry is parked."""
    stage(database, "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE id = :id",
          id=delivery_id)  # fmt: skip
    assert take(app, settings, delivery_id)
    status = deliver(database, settings, delivery_id)
    parked(database, delivery_id)
    return status


def failing_for(database: Database, tenant: TenantAuth, url: str, seconds: float) -> None:
    """Stage the URL's first failure (with no success since) `seconds` ago."""
    stage(database, "UPDATE failing_webhook_urls SET failing_since = now() - make_interval("
          "secs => :ago) WHERE tenant_id = :tenant AND url = :url",
          ago=seconds, tenant=tenant.id, url=url)  # fmt: skip


def disabled_urls(app: Flask, tenant: TenantAuth) -> dict[str, str]:
    response = app.test_client().get("/webhook-urls/disabled", headers=tenant.headers)
    assert response.status_code == 200, response.json
    return {item["url"]: item["reason"] for item in response.json["items"]}


def redeliver(app: Flask, tenant: TenantAuth, job_id: str, delivery_id: int) -> Any:
    return app.test_client().post(
        f"/jobs/{job_id}/deliveries/{delivery_id}/redeliver", headers=tenant.headers
    )


def job_of(database: Database, delivery_id: int) -> str:
    with database.sessionmaker() as session:
        return str(session.scalar(text("SELECT job_id FROM webhook_deliveries WHERE id = :id"),
                                  {"id": delivery_id}))  # fmt: skip


def test_a_url_failing_for_the_limit_is_disabled_and_a_redeliver_enables_it(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database,
) -> None:  # fmt: skip
    """Not before the limit; at the first failure after it the URL is disabled, its
    pending deliveries stop and a new one is not sent, each logged and redeliverable;
    redelivering one enables the URL again."""
    strict = hooks.with_overrides(webhook_disable_after_seconds=LIMIT)
    url = f"{receiver.base}/failing"
    receiver.scripts["/failing"] = [Reply(503)]
    first = parked(database, done_job(app_, tenant, url))
    other = parked(database, done_job(app_, tenant, url))
    assert attempt(app_, strict, database, first) == "pending"
    failing_for(database, tenant, url, LIMIT - 60)
    assert attempt(app_, strict, database, other) == "pending", "not before the limit"
    assert disabled_urls(app_, tenant) == {}
    failing_for(database, tenant, url, LIMIT + 1)
    assert attempt(app_, strict, database, first) == "disabled"
    assert disabled_urls(app_, tenant) == {url: "failing"}
    [stopped] = deliveries(app_, tenant, job_of(database, other))
    assert stopped["status"] == "disabled", "its pending delivery stops"
    assert "disabled after failing" in stopped["log"][-1]["error"]
    [ended] = deliveries(app_, tenant, job_of(database, first))
    assert ended["log"][-1]["status_code"] == 503 and "URL disabled" in ended["log"][-1]["error"]
    hits = len(receiver.at("/failing"))
    new = done_job(app_, tenant, url)
    assert attempt(app_, strict, database, new) == "disabled"
    assert len(receiver.at("/failing")) == hits, "nothing is sent to a disabled URL"
    receiver.scripts["/failing"] = [Reply(200)]  # the receiver is back
    response = redeliver(app_, tenant, job_of(database, other), other)
    assert response.status_code == 202, response.json
    assert disabled_urls(app_, tenant) == {}, "a redeliver enables a URL disabled for failing"
    assert attempt(app_, strict, database, other) == "delivered"
    assert Webhook(secret_of(database, tenant)).verify(
        receiver.at("/failing")[-1].body, receiver.at("/failing")[-1].headers)  # fmt: skip
    [still] = deliveries(app_, tenant, job_of(database, new))
    assert still["status"] == "disabled", "the others stay disabled until redelivered"


def test_a_success_in_between_starts_the_failing_time_again(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database,
) -> None:  # fmt: skip
    strict = hooks.with_overrides(webhook_disable_after_seconds=LIMIT)
    url = f"{receiver.base}/recovers"
    receiver.scripts["/recovers"] = [Reply(500), Reply(200), Reply(500)]
    first = parked(database, done_job(app_, tenant, url))
    assert attempt(app_, strict, database, first) == "pending"
    failing_for(database, tenant, url, LIMIT * 2)
    assert attempt(app_, strict, database, parked(database, done_job(app_, tenant, url))) == (
        "delivered"
    )
    failing_for(database, tenant, url, LIMIT * 2)  # no row to move: the success removed it
    assert attempt(app_, strict, database, first) == "pending"
    assert disabled_urls(app_, tenant) == {}


def test_a_limit_of_0_never_disables(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database,
) -> None:  # fmt: skip
    never = hooks.with_overrides(webhook_disable_after_seconds=0.0)
    url = f"{receiver.base}/never"
    receiver.scripts["/never"] = [Reply(503)]
    first = parked(database, done_job(app_, tenant, url))
    assert attempt(app_, never, database, first) == "pending"
    failing_for(database, tenant, url, 365 * 24 * 3600)
    assert attempt(app_, never, database, first) == "pending"
    assert disabled_urls(app_, tenant) == {}


def test_a_url_that_answered_410_is_enabled_only_by_its_tenant(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, hooks: Settings,
    database: Database,
) -> None:  # fmt: skip
    url = f"{receiver.base}/gone-then-back"
    receiver.scripts["/gone-then-back"] = [Reply(410), Reply(200)]
    gone = parked(database, done_job(app_, tenant, url))
    assert attempt(app_, hooks, database, gone) == "disabled"
    assert disabled_urls(app_, tenant) == {url: "gone"}
    refused = redeliver(app_, tenant, job_of(database, gone), gone)
    assert refused.status_code == 409 and refused.content_type == "application/problem+json"
    assert "410" in refused.json["detail"] and "/webhook-urls/disabled" in refused.json["detail"]
    assert disabled_urls(app_, tenant) == {url: "gone"}, "a redeliver does not enable a 410"
    client = app_.test_client()
    other = make_tenant(database)
    assert client.delete("/webhook-urls/disabled", query_string={"url": url},
                         headers=other.headers).status_code == 404  # fmt: skip
    assert client.delete("/webhook-urls/disabled", query_string={"url": url},
                         headers=tenant.headers).status_code == 204  # fmt: skip
    assert disabled_urls(app_, tenant) == {}
    again = client.delete("/webhook-urls/disabled", query_string={"url": url},
                          headers=tenant.headers)  # fmt: skip
    assert again.status_code == 404 and again.content_type == "application/problem+json"
    assert url in again.json["detail"]
    assert redeliver(app_, tenant, job_of(database, gone), gone).status_code == 202
    assert attempt(app_, hooks, database, gone) == "delivered"


def test_a_generation_sends_its_text_as_output_events_at_most_every_half_second(
    app_: Flask, receiver: ScriptedReceiver, tenant: TenantAuth, database: Database
) -> None:
    """`job.output` asked for: while the text is made, deliveries (Replicate's
    throttle: at most one every 500 ms) carry the job with its text so far, each
    a beginning of the final text; then `job.succeeded` with all of it."""
    url = f"{receiver.base}/generated"
    body = {"model": "smollm2", "inputs": {"prompt": "Once upon a time"},
            "parameters": {"max_tokens": 120, "temperature": 0},
            "webhook": {"url": url, "events": ["job.output", "job.succeeded"]}}  # fmt: skip
    response = app_.test_client().post("/jobs", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.json
    job_id = response.json["id"]  # type: ignore[index]

    def all_sent() -> bool:  # (swept while the text is made, as beat does every second)
        sent = deliveries(app_, tenant, job_id)
        ended = any(d["event_type"] == "job.succeeded" for d in sent)
        return ended and all(d["status"] == "delivered" for d in sent)

    pump(app_, all_sent, timeout=180)
    done = wait_for_job(app_.test_client(), tenant.headers, job_id)
    secret = secret_of(database, tenant)
    events = [verified(secret, r) for r in receiver.at("/generated")]
    outputs = [e["data"] for e in events if e["type"] == "job.output"]
    running = [data["outputs"]["text"] for data in outputs if data["status"] == "running"]
    assert len(running) >= 2, [(e["type"], e["data"]["status"]) for e in events]
    final = done["outputs"]["text"]
    for data in outputs:  # (one sent after the end says it all)
        assert data["id"] == job_id and final.startswith(data["outputs"]["text"]), data
    assert running == sorted(running, key=len) and len(running[0]) < len(final)
    [succeeded] = [e for e in events if e["type"] == "job.succeeded"]
    assert succeeded["data"]["outputs"]["text"] == final
    with database.engine.connect() as conn:
        made = conn.execute(text(
            "SELECT created_at FROM webhook_deliveries WHERE job_id = :id "
            "AND event_type = 'job.output' ORDER BY id"), {"id": job_id},
        ).scalars().all()  # fmt: skip
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(made)]
    assert len(made) == len(outputs) and all(gap >= 0.5 for gap in gaps), gaps
