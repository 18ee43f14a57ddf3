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
            assert 0 <= waited < 60, (row, claim)  # (seconds on two busy cores, not an hour)
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


# Scenario 18: what the simulated clock moves. Every time stored in the webhook tables;
# nothing else (jobs run and finish in real time, before their deliveries are made).
WEBHOOK_TIMES = {
    "webhook_deliveries": ("next_attempt_at", "created_at", "delivered_at", "lease_expires_at"),
    "webhook_attempts": ("at",),
    "failing_webhook_urls": ("failing_since",),
    "disabled_webhook_urls": ("disabled_at",),
}
OUTAGE = 6 * HOUR
DISABLE_AFTER = 5 * HOUR
# When (simulated seconds from the start) a job with a webhook is submitted: some
# whose schedules run while the URL fails, one near the limit, one after it.
SUBMIT_AT = (0.0, 2 * HOUR, 4 * HOUR, 5.5 * HOUR, 5.85 * HOUR)
SCHEDULE = (0, 5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)  # the default


def quiet(stack: FaultStack, ids: list[str]) -> float | None:
    """Seconds until the next pending delivery is due (by the database's clock) when
    nothing is in flight: every job finished, no delivery being sent or already
    due; None while something is. Infinity when nothing is pending."""
    if any(s not in ("succeeded", "failed") for s in stack.statuses(ids).values()):
        return None
    with stack.engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT count(*) FILTER (WHERE status IN ('sending', 'in_flight')) AS busy, "
            "extract(epoch FROM min(next_attempt_at) FILTER (WHERE status = 'pending') - now()) "
            "AS due_in FROM webhook_deliveries"
        )).one()  # fmt: skip
    if row.busy or (row.due_in is not None and row.due_in <= 0):
        return None
    return float("inf") if row.due_in is None else float(row.due_in)


def advance(stack: FaultStack, seconds: float) -> None:
    """Simulated time passes: every stored webhook time moves `seconds` back, so the
    database's now() stands that much later among them."""
    with stack.engine.begin() as conn:
        for table, columns in WEBHOOK_TIMES.items():
            moved = ", ".join(f"{c} = {c} - make_interval(secs => :s)" for c in columns)
            conn.execute(sa.text(f"UPDATE {table} SET {moved}"), {"s": seconds})


def test_18_a_webhook_receiver_down_for_six_hours_simulated(
    make_stack: Callable[..., FaultStack],
    receivers: Callable[[str, Callable[[str, int], int]], Receiver],
) -> None:
    """A tenant's receiver answers 503 for six hours; the default retry schedule, and
    WEBHOOK_DISABLE_AFTER_SECONDS at 5 h. Simulated time: whenever nothing is in flight
    (every job finished, no delivery being sent or due) the test moves every time
    stored in the webhook tables (WEBHOOK_TIMES: due times, creation and attempt
    times, a URL's first failure, its disabling) back to the next due delivery or
    the next scripted event (a job's submission, the receiver's return), which is
    what the database's now() advancing among them would do; the processes, their
    sleeps and the jobs run in real time. A time below is its stored value, so
    relative to another stored time it is simulated time. Checked: each attempt
    after the schedule's step (within its 10% jitter, plus the few real seconds of
    a sweep), the URL disabled by the first failure at least 5 h after its first
    (none before), every delivery in the log with each attempt the receiver got,
    and, once the receiver is back, a redeliver of each delivery that re-enables
    the URL and sends the same body, signed. No guard in app.jobs.guards handles
    this: the rule is the service's own."""
    stack = make_stack(
        WEBHOOK_ALLOW_PRIVATE_NETWORKS="true", WEBHOOK_DISABLE_AFTER_SECONDS=str(DISABLE_AFTER),
        WEBHOOK_RETRY_SCHEDULE=",".join(str(s) for s in SCHEDULE),
    )  # fmt: skip
    down = threading.Event()
    down.set()
    receiver = receivers(webhook_secret(stack), lambda _id, _n: 503 if down.is_set() else 200)
    stack.start_api()
    stack.start_beat()
    start_worker(stack, "worker0", "inference,webhooks")

    ids: list[str] = []
    simulated, steps, started = 0.0, 0, time.monotonic()
    pending = list(SUBMIT_AT)
    while simulated < OUTAGE:
        if pending and pending[0] <= simulated:
            pending.pop(0)
            ids += submit_each(stack, [{**digits(len(ids)), "webhook": {"url": receiver.url}}])
            continue
        due_in = quiet(stack, ids)
        if due_in is None:
            assert time.monotonic() - started < 120, "the deliveries did not settle"
            time.sleep(0.05)
            continue
        step = min(due_in, (pending[0] if pending else OUTAGE) - simulated)
        advance(stack, step)
        simulated += step
        steps += 1
    down.clear()  # the receiver is back, six hours on

    headers = {"Authorization": f"Bearer {stack.api_key}"}

    def log_of(job: str) -> dict[str, Any]:
        items = requests.get(f"{stack.base}/jobs/{job}/deliveries", headers=headers,
                             timeout=30).json()["items"]  # fmt: skip
        assert len(items) == 1, items
        found: dict[str, Any] = items[0]
        return found

    logs = [log_of(job) for job in ids]
    disabled = requests.get(f"{stack.base}/webhook-urls/disabled", headers=headers, timeout=30)
    assert disabled.json()["items"][0]["url"] == receiver.url, disabled.json()
    assert disabled.json()["items"][0]["reason"] == "failing", disabled.json()
    # The schedule: each attempt its step after the one before (jitter of 10%, and the
    # sweep's second and a busy machine's few more on top).
    gaps = []
    sent = [(log, [a for a in log["log"] if a["status_code"] is not None]) for log in logs]
    for log, attempts in sent:
        times = [datetime.fromisoformat(a["at"]) for a in attempts]
        for k in range(1, len(times)):
            gap = (times[k] - times[k - 1]).total_seconds()
            assert SCHEDULE[k] * 0.9 <= gap <= SCHEDULE[k] * 1.1 + 30, (k, gap, log)
            gaps.append(gap / SCHEDULE[k])
    # The limit: the first failure after 5 h of failing disables the URL, none before.
    every = sorted(
        ((datetime.fromisoformat(a["at"]), a) for _, attempts in sent for a in attempts),
        key=lambda pair: pair[0],
    )
    first_failure = every[0][0]
    disabling = [(at, a) for at, a in every if "URL disabled" in (a["error"] or "")]
    assert len(disabling) == 1, disabling
    disabled_at = disabling[0][0]
    after = (disabled_at - first_failure).total_seconds()
    assert after >= DISABLE_AFTER, after
    assert all((at - first_failure).total_seconds() < DISABLE_AFTER
               for at, _ in every if at < disabled_at)  # fmt: skip
    assert [at for at, _ in every if at > disabled_at] == [], "nothing sent once disabled"
    # Every delivery in the log: disabled, each attempt the receiver got logged.
    assert [log["status"] for log in logs] == ["disabled"] * len(ids), logs
    for log, attempts in sent:
        got = [a for a in receiver.arrivals if a.message_id == log["message_id"]]
        assert [a["status_code"] for a in attempts] == [a.answered for a in got] == [503] * len(got)
    unsent = [log for log, attempts in sent if not attempts]
    stopped = [log for log, attempts in sent
               if attempts and "URL disabled" not in (attempts[-1]["error"] or "")]  # fmt: skip
    assert unsent and stopped, "a new delivery is not sent, a pending one stops"
    assert all("disabled after failing" in log["log"][-1]["error"] for log in unsent + stopped)

    # The receiver is back: a redeliver re-enables the URL; each delivery is sent again.
    for job, log in zip(ids, logs, strict=True):
        response = requests.post(f"{stack.base}/jobs/{job}/deliveries/{log['id']}/redeliver",
                                 headers=headers, timeout=30)  # fmt: skip
        assert response.status_code == 202, response.text
        if log is logs[0]:
            assert requests.get(f"{stack.base}/webhook-urls/disabled", headers=headers,
                                timeout=30).json()["items"] == []  # fmt: skip
    redelivered_by = time.monotonic() + 30
    while time.monotonic() < redelivered_by and receiver.answered(200) < len(ids):
        time.sleep(0.2)
    assert receiver.answered(200) == len(ids), receiver.arrivals
    assert all(a.verified for a in receiver.arrivals), receiver.arrivals
    for log in logs:
        bodies = [a.body for a in receiver.arrivals if a.message_id == log["message_id"]]
        assert all(body == bodies[-1] for body in bodies), "the same payload every time"
    wait_delivered = time.monotonic() + 30
    while time.monotonic() < wait_delivered and any(
        log_of(job)["status"] != "delivered" for job in ids
    ):
        time.sleep(0.2)

    tally = stack.tally(
        "18. A webhook receiver down for six hours (simulated)", "on", ids, len(ids)
    )
    attempts_made = sum(len(attempts) for _, attempts in sent)
    tally.notes.append(
        f"{len(ids)} deliveries, {attempts_made} attempts over {simulated / HOUR:.0f} simulated "
        f"hours ({steps} steps); gaps {min(gaps):.2f}-{max(gaps):.2f} of the schedule's step; "
        f"URL disabled {after / HOUR:.2f} h after its first failure (limit 5 h), "
        f"{len(stopped)} pending stopped, {len(unsent)} not sent; all redelivered (200, signed)"
    )
    check(tally, True, lambda t: False)
    assert [log_of(job)["status"] for job in ids] == ["delivered"] * len(ids)
    assert tally.duplicate_executions == 0, tally
