"""Webhooks end to end: a real HTTP receiver on loopback, scripted to misbehave,
a real webhook worker process, every delivery verified with `standardwebhooks`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from standardwebhooks import Webhook

from app import create_app
from app.config import Settings
from app.db.models import Tenant
from app.db.session import Database, current_session
from app.tenants import rotate_webhook_secret
from app.webhooks import delivery
from app.webhooks.receiver import DuplicateDelivery, Receiver, WebhookVerificationError
from tests.conftest import TenantAuth, WorkerProcess, make_tenant, wait_for_job

BODY = {"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}
SCHEDULE = "0,0.2,0.2,0.2,0.2"  # five attempts, quickly


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedReceiver:
    """Answers each path with its script, one reply per request (the last repeats)."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Reply]] = {}
        self.received: list[Received] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(Received(self.path, dict(self.headers), body))
                script = receiver.scripts.get(self.path, [Reply()])
                reply = script.pop(0) if len(script) > 1 else script[0]
                time.sleep(reply.delay)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up (timeout)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
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
def webhook_worker(
    hooks: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = start_webhook_worker(hooks, tmp_path_factory.mktemp("hooks") / "worker.log")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def app_(hooks: Settings, worker: Any, webhook_worker: WorkerProcess) -> Flask:
    return create_app(hooks)


def pump(app: Flask, until: Callable[[], bool], timeout: float = 30) -> None:
    """Run the webhook sweep (what beat does every second) until `until()` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "condition not reached"
        with app.app_context():
            settings = app.extensions["settings"]
            for delivery_id in delivery.take_due(current_session(), settings):
                app.extensions["celery"].send_task(
                    delivery.DELIVER_TASK, args=[delivery_id], queue=settings.webhooks_queue
                )
        time.sleep(0.1)


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
    assert "Timeout" in log[0]["error"] and log[0]["status_code"] is None
    assert log[1]["status_code"] == 301 and "not followed" in log[1]["error"]
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
    with database.sessionmaker() as session:
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
    with app_.app_context():
        session = current_session()
        due = delivery.take_due(session, strict)
        [mine] = [d for d in deliveries(app_, tenant, job["id"]) if d["id"] in due]
        assert delivery.deliver(session, strict, mine["id"]) == "failed"
    assert receiver.at("/inside") == []
    [logged] = deliveries(app_, tenant, job["id"])
    assert "not a public address" in logged["log"][0]["error"]
    letters = app_.test_client().get("/dead-letters?error_code=webhook_undeliverable",
                                     headers=tenant.headers).json["items"]  # fmt: skip
    assert any(x["job_id"] == job["id"] for x in letters)
