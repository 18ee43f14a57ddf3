"""Fault scenarios of time: a worker whose wall clock jumps, a webhook receiver down
for hours.

Time the service decides by (leases, deadlines, retry backoff, webhook attempts)
is PostgreSQL's `now()`, one clock for every process; these scenarios check
that a process's own clock never takes part.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from app.cli.launcher import worker_command
from tests.conftest import QUIET_WORKER
from tests.faults.clock import SKEW_VARIABLE
from tests.faults.harness import FAULT_ENTRY_POINT, FaultStack, Service
from tests.faults.scenarios import ROWS, check, digits, slow
from tests.models import build_flaky_digits

pytestmark = [pytest.mark.faults, pytest.mark.processes]

HOUR = 3600.0

# Every change of a job's status, attempt, lease or run_after, with the database's
# time of the change (the transaction's now(), which the SQL of the change used).
CLOCK_LOG = """
CREATE TABLE clock_log (
    id bigserial PRIMARY KEY, job_id uuid, old_status text, new_status text,
    attempts int, lease_expires_at timestamptz, run_after timestamptz,
    tx_at timestamptz DEFAULT now()
);
CREATE FUNCTION log_job_clock() RETURNS trigger AS $$ BEGIN
    INSERT INTO clock_log (job_id, old_status, new_status, attempts, lease_expires_at,
                           run_after)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, NEW.lease_expires_at,
            NEW.run_after);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_clock_log AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempts IS DISTINCT FROM NEW.attempts
          OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at
          OR OLD.run_after IS DISTINCT FROM NEW.run_after)
    EXECUTE FUNCTION log_job_clock();
"""


def start_worker(
    stack: FaultStack, name: str, queues: str, concurrency: int = 2, **env: str
) -> Service:
    """A worker from the suite's entry point (where FAULTS_CLOCK_SKEW_SECONDS is read),
    on `queues` (a comma list), with `env` on top of the stack's."""
    hostname = f"{name}-{uuid.uuid4().hex[:6]}@%h"
    args = worker_command(queues, concurrency, hostname, *QUIET_WORKER, app=FAULT_ENTRY_POINT)
    service = Service(name, args, {**stack.env, **env}, stack.root).start()
    service.wait_for_log(b" ready.")
    stack.services[name] = service
    return service


@dataclass
class Arrival:
    message_id: str
    answered: int
    verified: bool
    timestamp: int  # the webhook-timestamp header
    body: dict[str, Any]
    at: float = field(default_factory=time.time)


class Receiver:
    """A webhook receiver on loopback that verifies every request (Standard Webhooks,
    5 minutes' tolerance on the timestamp, as the reference package checks) and
    answers what `answer(message_id, attempt)` says (a request that does not verify
    is answered 400)."""

    def __init__(self, secret: str, answer: Callable[[str, int], int]) -> None:
        self.arrivals: list[Arrival] = []
        self.lock = threading.Lock()
        receiver, webhook = self, Webhook(secret)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                message_id = headers.get("webhook-id", "")
                try:
                    webhook.verify(body, headers)
                    verified = True
                except WebhookVerificationError:
                    verified = False
                with receiver.lock:
                    attempt = sum(a.message_id == message_id for a in receiver.arrivals) + 1
                    code = answer(message_id, attempt) if verified else 400
                    receiver.arrivals.append(Arrival(
                        message_id, code, verified, int(headers.get("webhook-timestamp", 0)),
                        json.loads(body),
                    ))  # fmt: skip
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answered(self, code: int) -> int:
        with self.lock:
            return sum(a.answered == code for a in self.arrivals)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receivers() -> Iterator[Callable[[str, Callable[[str, int], int]], Receiver]]:
    made: list[Receiver] = []

    def make(secret: str, answer: Callable[[str, int], int]) -> Receiver:
        made.append(Receiver(secret, answer))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def webhook_secret(stack: FaultStack) -> str:
    with stack.engine.connect() as conn:
        query = "SELECT webhook_secret FROM tenants WHERE name = 'faults'"
        secret: str = conn.scalar(sa.text(query))
    return secret


def db_now(stack: FaultStack) -> datetime:
    with stack.engine.connect() as conn:
        now: datetime = conn.scalar(sa.text("SELECT now()"))
    return now


def submit_each(stack: FaultStack, bodies: list[dict[str, Any]], **headers: str) -> list[str]:
    """POST each body (every one must be acknowledged); the jobs' ids in order."""
    ids = []
    for body in bodies:
        response = requests.post(
            f"{stack.base}/jobs", json=body, timeout=30,
            headers={"Authorization": f"Bearer {stack.api_key}", **headers},
        )  # fmt: skip
        assert response.status_code == 202, response.text
        ids.append(str(response.json()["id"]))
    return ids


def flaky(i: int) -> dict[str, Any]:
    """A digits-flaky job whose pixel above 16 makes ONNX Runtime fail to allocate, on
    every attempt: it is retried after its backoff until its attempts are used up."""
    row = list(ROWS[i % len(ROWS)])
    row[5] = 17.0
    return {"model": "digits-flaky", "inputs": {"pixels": [row]}}


def test_17_the_wall_clock_of_a_worker_jumps_an_hour_forward(
    make_stack: Callable[..., FaultStack],
    model_repository: Path,
    receivers: Callable[[str, Callable[[str, int], int]], Receiver],
) -> None:
    """The one worker (inference and webhook deliveries) reads a wall clock an hour
    ahead (tests.faults.clock); the API, beat's sweeps and PostgreSQL keep the true
    one. Jobs with deadlines, jobs that fail and are retried after a backoff, jobs
    that outlive their lease, and webhooks whose first attempt gets a 503: nothing
    may expire early, a lease must be renewed (never taken back), a retry and a
    webhook's second attempt come after their wait by the database's clock (not an
    hour late, not at once), and signatures carry the database's time."""
    build_flaky_digits(model_repository, model_repository / "digits" / "1")
    stack = make_stack(
        RETRY_BACKOFF_SECONDS="1", RETRY_BACKOFF_MAX_SECONDS="2",
        WEBHOOK_ALLOW_PRIVATE_NETWORKS="true", WEBHOOK_RETRY_SCHEDULE="0,2,2",
    )  # fmt: skip
    with stack.engine.begin() as conn:
        conn.exec_driver_sql(CLOCK_LOG)
    receiver = receivers(webhook_secret(stack), lambda _id, attempt: 503 if attempt == 1 else 200)
    stack.start_api()
    stack.start_beat()
    worker = start_worker(stack, "worker0", "inference,webhooks", **{SKEW_VARIABLE: str(HOUR)})
    assert b"wall clock +3600 s" in worker.log_path.read_bytes()

    deadline = (db_now(stack) + timedelta(seconds=60)).isoformat()
    hooked = [{**digits(i), "deadline": deadline, "webhook": {"url": receiver.url}}
              for i in range(10)]  # fmt: skip
    plain = [{**digits(i), "deadline": deadline} for i in range(10, 60)]
    hooked_ids, plain_ids = submit_each(stack, hooked), stack.submit(plain)
    flaky_ids = submit_each(stack, [flaky(i) for i in range(6)])
    slow_ids = submit_each(stack, [slow(4.0), slow(4.0)])
    late_ids = submit_each(stack, [slow(5.0)], **{"Cancel-After": "2"})
    ids = hooked_ids + plain_ids + flaky_ids + slow_ids + late_ids
    expected = {
        **dict.fromkeys(hooked_ids + plain_ids + slow_ids, "succeeded"),
        **dict.fromkeys(flaky_ids, "failed"),
        **dict.fromkeys(late_ids, "expired"),
    }

    done = stack.wait_terminal(ids, timeout=60)
    delivered_by = time.monotonic() + 30
    while time.monotonic() < delivered_by and receiver.answered(200) < len(hooked_ids):
        time.sleep(0.2)
    tally = stack.tally("17. The wall clock of a worker jumps an hour forward", "on", ids, len(ids))
    statuses = stack.statuses(ids)
    tally.completed = sum(statuses.get(i) == want for i, want in expected.items())
    tally.recovery_s = done and round(done, 1)
    with stack.engine.connect() as conn:
        log = conn.execute(sa.text(
            "SELECT job_id::text AS job, old_status, new_status, attempts, lease_expires_at, "
            "run_after, tx_at FROM clock_log ORDER BY id"
        )).all()  # fmt: skip
        jobs = {r.id: r for r in conn.execute(sa.text(
            "SELECT id::text, status, attempts, max_attempts, deadline_at, finished_at FROM jobs"
        ))}  # fmt: skip

    # Retries: each waits its backoff (0 to 2 s) from the failure, by the database's
    # clock, and is claimed once it is over (not before; within seconds, not an hour).
    retries, waits = 0, []
    for job in flaky_ids:
        rows = [r for r in log if r.job == job]
        for n, row in enumerate(rows):
            if (row.old_status, row.new_status) != ("running", "queued"):
                continue
            retries += 1
            assert timedelta(0) <= row.run_after - row.tx_at <= timedelta(seconds=2), row
            claim = next(r for r in rows[n + 1 :] if r.new_status == "running")
            waited = (claim.tx_at - row.run_after).total_seconds()
            assert 0 <= waited < 30, (row, claim)
            waits.append(waited)
        assert jobs[job].attempts == jobs[job].max_attempts, jobs[job]  # the card's 6
    # Leases: renewed while the 4 s jobs ran (1.5 s each, from the database's now()),
    # and never taken back.
    renewals = 0
    for job in slow_ids:
        for row in (r for r in log if r.job == job and r.new_status == "running"):
            ahead = (row.lease_expires_at - row.tx_at).total_seconds()
            assert 1.0 <= ahead <= 2.0, row
        renewals += sum(1 for r in log if r.job == job
                        and (r.old_status, r.new_status) == ("running", "running"))  # fmt: skip
        assert jobs[job].attempts == 1, jobs[job]
    # Deadlines: none ended before its time; the one that ran past it expired after it.
    late = jobs[late_ids[0]]
    assert late.finished_at >= late.deadline_at, late
    # Webhooks: a 503, then the second attempt after 2 s (+-10%) by the database's clock.
    gaps, off = [], []
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    for job in hooked_ids:
        items = requests.get(f"{stack.base}/jobs/{job}/deliveries", headers=headers,
                             timeout=30).json()["items"]  # fmt: skip
        assert [d["status"] for d in items] == ["delivered"], items
        attempts = items[0]["log"]
        assert [a["status_code"] for a in attempts] == [503, 200], attempts
        first, second = (datetime.fromisoformat(a["at"]) for a in attempts)
        gaps.append((second - first).total_seconds())
    for arrival in receiver.arrivals:
        sent = datetime.fromisoformat(arrival.body["timestamp"]).timestamp()
        off.append(max(abs(arrival.timestamp - arrival.at), abs(sent - arrival.at)))
    tally.notes.append(
        f"worker's clock +1 h; {retries} retries, claimed {min(waits, default=0):.1f}-"
        f"{max(waits, default=0):.1f} s after their backoff; {renewals} lease renewals; "
        f"{len(gaps)} webhooks sent again {min(gaps, default=0):.1f}-"
        f"{max(gaps, default=0):.1f} s after a 503 (schedule: 2 s)"
    )
    check(tally, True, lambda t: False)
    assert retries == len(waits) == sum(jobs[j].max_attempts - 1 for j in flaky_ids), waits
    assert renewals >= 2, renewals
    assert all(1.8 <= gap < 30 for gap in gaps) and len(gaps) == 10, gaps
    assert all(a.verified for a in receiver.arrivals), receiver.arrivals
    assert max(off) < 60, off
    assert tally.duplicate_executions == 0, tally
