"""The service on a fleet of hosts (network namespaces, cgroups, links to the data
host through a delay proxy): how its throughput scales with worker hosts, and a
run of faults between hosts checked afterwards from the client's history.
`make test-fleet` runs these; each writes its figures into var/fleet/report.json."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import sqlalchemy as sa

from tests.fleet.checker import (
    Fault,
    check,
    check_generations,
    check_schedule,
    read_history,
)
from tests.fleet.delay import SLACK
from tests.fleet.stack import API_HOSTS, PYTHON, ROOT, SETTINGS, WORKER_HOSTS, FleetStack

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and cgroups need root"),
]
REPORT = ROOT / "var" / "fleet" / "report.json"
LEASE_S = float(SETTINGS["JOB_LEASE_SECONDS"])
SWEEP_S = float(SETTINGS["SWEEP_INTERVAL_SECONDS"])


def record(section: str, figures: dict[str, Any]) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    report[section] = figures
    REPORT.write_text(json.dumps(report, indent=2) + "\n")


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetStack]:
    made = FleetStack(tmp_path_factory.mktemp("fleet", numbered=True))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def chat_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetStack]:
    """The fleet with the chat model too, for the generations of the fault run."""
    made = FleetStack(tmp_path_factory.mktemp("fleet", numbered=True), ("digits", "smollm2"))
    try:
        yield made
    finally:
        made.close()


def run_client(
    stack: FleetStack, history: Path, duration: float, **rates: str
) -> subprocess.Popen[bytes]:
    apis = ",".join(stack.url(name) for name in API_HOSTS)
    args = [PYTHON, "-m", "tests.fleet.client", "--apis", apis, "--key", stack.api_key,
            "--history", str(history), "--duration", str(duration)]  # fmt: skip
    for name, value in rates.items():
        args += [f"--{name.replace('_', '-')}", value]
    return stack.client_host.spawn("client", args, stack.host_env(stack.client_host), cwd=ROOT)


def finished_between(engine: sa.Engine, start: float, end: float) -> int:
    with engine.connect() as conn:
        count: int = conn.execute(sa.text(
            "SELECT count(*) FROM jobs WHERE finished_at >= to_timestamp(:s) "
            "AND finished_at < to_timestamp(:e)"), {"s": start, "e": end}).scalar_one()  # fmt: skip
    return count


def top_up(stack: FleetStack, engine: sa.Engine, needed: float) -> int:
    """Bulk-submit `heavy` jobs until `needed` are queued (a fast machine's hosts
    would run the backlog out inside a window, and its rate would not be a
    capacity); returns how many were added."""
    with engine.connect() as conn:
        queued = conn.execute(
            sa.text("SELECT count(*) FROM jobs WHERE status = 'queued'")
        ).scalar_one()
    missing = max(0, int(needed) - queued)
    job = {"model": "heavy", "inputs": {"pixels": [[float(j % 16) for j in range(64)]] * 2}}
    for start in range(0, missing, 1000):
        size = min(1000, missing - start)
        response = requests.post(
            f"{stack.url(API_HOSTS[start // 1000 % 2])}/jobs/bulk",
            json={"jobs": [job] * size},
            headers=stack.auth,
            timeout=60,
        )
        assert response.status_code == 202 and response.json()["refused"] == 0, response.text
    return missing


def counters(stack: FleetStack, engine: sa.Engine) -> dict[str, int]:
    """The data host's cumulative counters: transactions committed (a NOTIFYing
    commit waits its turn behind the others'), WAL bytes written, Redis commands."""
    with engine.connect() as conn:
        commits, wal = conn.execute(sa.text(
            "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint "
            "FROM pg_stat_database WHERE datname = current_database()")).one()  # fmt: skip
    info = redis.Redis.from_url(stack.data.redis_url, socket_timeout=5).info("stats")
    commands = info["total_commands_processed"]
    return {"commits": commits, "wal_bytes": wal, "redis_commands": commands}


def test_the_hosts_are_separate_machines(stack: FleetStack) -> None:
    """Each host its own network namespace, address and hostname; the data host's
    servers reached from another host only through the delay proxy."""
    seen: dict[str, tuple[str, str, str]] = {}
    for name, host in stack.fleet.hosts.items():
        done = host.run(["sh", "-c", "readlink /proc/self/ns/net; hostname; "
                         "ip -4 -o addr show eth0"])  # fmt: skip
        namespace, hostname, address = done.stdout.splitlines()[:3]
        assert hostname == name and f"inet {host.address}/" in address, done.stdout
        seen[name] = (namespace, hostname, host.address)
    assert len({n for n, _, _ in seen.values()}) == len(seen), "hosts share a namespace"
    assert len({a for _, _, a in seen.values()}) == len(seen), "hosts share an address"
    reach = stack.host("w1").run(["python3", "-c", PING_REDIS.format(stack.data_host.address)])
    answer, fastest_ms = reach.stdout.split()
    assert answer == "+PONG", reach.stdout + reach.stderr
    # The delay proxy's delay each way, less its jitter and the slack it delivers
    # early by, is a floor (2 ms; a round trip between namespaces takes ~0.1 ms).
    floor_ms = 2 * (stack.data.delay_ms - stack.data.jitter_ms - SLACK * 1000)
    assert float(fastest_ms) >= floor_ms, f"a round trip to data took {fastest_ms} ms: no proxy?"


PING_REDIS = """
import socket, time
s = socket.create_connection(("{0}", 6379), timeout=5)
times = []
for _ in range(20):
    started = time.perf_counter()
    s.sendall(b"PING\\r\\n")
    answer = s.recv(7)
    times.append((time.perf_counter() - started) * 1000)
print(answer.decode().strip(), min(times))
"""


def test_throughput_scales_with_worker_hosts(stack: FleetStack) -> None:
    """A backlog of compute-bound jobs submitted first, then one, two and three
    worker hosts (the same CPU quota each) started in turn: jobs/s in a window of
    each, and CPU per job of each role from the hosts' cgroups."""
    engine = stack.engine()
    stack.start(workers=())
    history = stack.root / "scaling.jsonl"
    cpu0 = stack.cpu_seconds()
    client = run_client(stack, history, 40, async_rate="200", sync_rate="0.1", model="heavy",
                        rows="2")  # fmt: skip
    assert client.wait(300) == 0, stack.log_tail("client", "client")
    cpu1 = stack.cpu_seconds()
    accepted = sum(1 for e in read_history(history) if e["kind"] == "submit" and e.get("id"))
    assert accepted > 7000, f"only {accepted} submits accepted"
    api_ms = sum(cpu1[h] - cpu0[h] for h in API_HOSTS) * 1000 / accepted
    figures: dict[str, Any] = {"backlog": accepted, "api_cpu_ms_per_submit": round(api_ms, 2)}
    window = 20.0
    rates = []
    for n in (1, 2, 3):
        if rates:  # enough left for n hosts through their start, warm-up and window
            figures[f"topped_up_before_{n}"] = top_up(stack, engine, n * rates[0] * 60)
        stack.start_worker(WORKER_HOSTS[n - 1])
        stack.wait_serving((WORKER_HOSTS[n - 1],))
        time.sleep(5)  # its first jobs: sessions warm
        before, start, counted = stack.cpu_seconds(), time.time(), counters(stack, engine)
        time.sleep(window)
        after, end = stack.cpu_seconds(), time.time()
        counted = {k: v - counted[k] for k, v in counters(stack, engine).items()}
        done = finished_between(engine, start, end)
        assert done > 0
        worker_s = sum(after[h] - before[h] for h in WORKER_HOSTS[:n])
        rates.append(done / window)
        figures[f"{n}_worker_hosts"] = {
            "jobs_per_s": round(done / window, 1),
            "efficiency": round(done / window / (n * rates[0]), 3),
            "worker_cpu_ms_per_job": round(worker_s * 1000 / done, 2),
            "data_host_cores": round((after["data"] - before["data"]) / window, 3),
            "data_cpu_ms_per_job": round((after["data"] - before["data"]) * 1000 / done, 2),
            "commits_per_job": round(counted["commits"] / done, 2),
            "wal_bytes_per_job": round(counted["wal_bytes"] / done),
            "redis_commands_per_job": round(counted["redis_commands"] / done, 1),
            "control_cores": round(sum(after[h] - before[h] for h in ("ctl1", "ctl2")) / window, 3),
        }
    record("scaling", figures)
    print(json.dumps(figures, indent=2))
    with engine.connect() as conn:
        left = conn.execute(
            sa.text("SELECT count(*) FROM jobs WHERE status = 'queued'")
        ).scalar_one()
    assert left > 0, "the backlog ran out inside a window: the rates are not capacities"
    for n in (2, 3):
        assert figures[f"{n}_worker_hosts"]["efficiency"] >= 0.85, figures


PARTITION_S = 3 * LEASE_S
SCHEDULE_EVERY_S = 5
BATCH_ROWS = 20_000


def start_schedule(stack: FleetStack) -> str:
    """A schedule firing every 5 s on a file of the tenant's data area."""
    area = Path(stack.env["DATA_DIR"]) / "fleet" / "incoming"
    area.mkdir(parents=True, exist_ok=True)
    row = json.dumps({"pixels": [float(i % 16) for i in range(64)]})
    (area / "rows.jsonl").write_text((row + "\n") * 10)
    body = {"name": "every-5s", "cron": f"* * * * * */{SCHEDULE_EVERY_S}", "model": "digits",
            "input": {"path": "incoming"}, "output": "scored"}  # fmt: skip
    response = requests.post(f"{stack.url('api2')}/schedules", json=body, headers=stack.auth,
                             timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def start_batch(stack: FleetStack) -> str:
    """One file batch of BATCH_ROWS rows, split into chunk jobs while the faults run."""
    row = json.dumps({"pixels": [float(i % 16) for i in range(64)]})
    data = ((row + "\n") * BATCH_ROWS).encode()
    base = stack.url("api2")
    octets = {**stack.auth, "Content-Type": "application/octet-stream"}
    uploaded = requests.post(f"{base}/files?filename=rows.jsonl", data=data, headers=octets,
                             timeout=60)  # fmt: skip
    assert uploaded.status_code == 201, uploaded.text
    batch = requests.post(f"{base}/batches", json={"model": "digits", "file_id":
                          uploaded.json()["id"]}, headers=stack.auth, timeout=30)  # fmt: skip
    assert batch.status_code == 202, batch.text
    return str(batch.json()["id"])


def test_faults_between_hosts(chat_stack: FleetStack) -> None:
    """50 async jobs/s, 5 sync calls/s and two generations followed live from the
    client host, alternating between the API hosts, a batch and a schedule, while
    at fixed times: w2 partitioned from the data host (a silent drop) for three
    lease lengths, w3 killed as a whole host (restarted 45 s later), api1 cut
    off for 30 s, ctl1 frozen for 90 s, Redis restarted, PostgreSQL restarted
    (each fault several leases long, and at least two recovery bounds from the
    next one's start).
    Checked afterwards from the client's history and the database
    (tests.fleet.checker)."""
    stack = chat_stack
    engine = stack.engine()
    stack.start(concurrency=2)
    schedule_id, batch_id = start_schedule(stack), start_batch(stack)
    w2, w3 = stack.host("w2"), stack.host("w3")
    api1, ctl1 = stack.host("api1"), stack.host("ctl1")
    plan: list[tuple[str, float, float, Any, Any]] = [
        ("w2 partitioned from data", 30, PARTITION_S,
         lambda: stack.data.cut(w2.address), lambda: stack.data.heal(w2.address)),
        ("w3 killed", 60, 45, w3.kill, lambda: stack.start_worker("w3", 2)),
        ("api1 cut off", 125, 30, api1.isolate, api1.rejoin),
        ("ctl1 frozen", 170, 90, ctl1.freeze, ctl1.thaw),
        ("Redis restarted", 185, 3, lambda: stack.data.restart_redis(3), lambda: None),
        ("PostgreSQL restarted", 220, 3, lambda: stack.data.restart_postgres(3), lambda: None),
    ]  # fmt: skip
    duration = 275.0
    history = stack.root / "history.jsonl"
    client = run_client(stack, history, duration, async_rate="50", sync_rate="5",
                        generations="2")  # fmt: skip
    start = time.time()
    faults: list[Fault] = []
    events = sorted([(at, "inject", i) for i, (_, at, _, _, _) in enumerate(plan)]
                    + [(at + s, "heal", i) for i, (_, at, s, _, _) in enumerate(plan)])  # fmt: skip
    began: dict[int, float] = {}
    holders = []
    terms = LeaseWatch(engine)
    for at, action, i in events:
        time.sleep(max(0.0, start + at - time.time()))
        name, _, _, inject, heal = plan[i]
        if action == "inject":
            began[i] = time.time()
            holders.append((name, lease_holder(engine)))
            inject()
        else:
            heal()
            cut = stack.url("api1") if inject == api1.isolate else None
            faults.append(Fault(name, began[i], time.time(), cut))
        print(f"{time.time() - start:6.1f}s {action} {name}", flush=True)
    assert client.wait(duration + 240) == 0, stack.log_tail("client", "client")
    end = time.time()
    terms.stop()
    frozen = next(f for f in faults if f.name == "ctl1 frozen")
    control = terms.takeover(frozen, "ctl1", stack)
    bound = LEASE_S + SWEEP_S + 10
    deadline = time.time() + 120  # every accepted job terminal: waited for, not assumed
    while time.time() < deadline:
        with engine.connect() as conn:
            open_jobs = conn.execute(
                sa.text("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
            ).scalar_one()
        if not open_jobs:
            break
        time.sleep(1)
    recorded = read_history(history)
    verdict = check(recorded, engine, faults, bound, 2 * (LEASE_S + SWEEP_S))
    generations = check_generations(recorded, engine)
    schedule = check_schedule(engine, schedule_id, SCHEDULE_EVERY_S, start + 10, end - 10)
    with engine.connect() as conn:
        batch = conn.execute(
            sa.text("SELECT status, rows FROM batches WHERE id = CAST(:b AS uuid)"),
            {"b": batch_id},
        ).one()
        fenced = conn.execute(sa.text("SELECT holder, token FROM control_leases")).one()
    figures = {**verdict.report(), "faults": [f.__dict__ | {"start": round(f.start - start, 1),
               "end": round(f.end - start, 1)} for f in faults],
               "lease_holder_at_each_fault": holders, "control_plane": control,
               "control_lease_at_end": list(map(str, fenced)),
               "generations": generations, "schedule": schedule,
               "batch": {"status": batch[0], "rows": batch[1]},
               "terminal_bound_s": bound}  # fmt: skip
    record("faults", figures)
    print(json.dumps(figures, indent=2))
    assert verdict.acknowledged > 0.8 * 50 * duration
    assert not verdict.problems(), verdict.problems()
    slow = {k: v for k, v in verdict.recovery_s.items() if v is None}
    assert not slow, f"throughput not back to 95% within 2 x (lease + sweep) after {slow}"
    assert not generations["problems"], generations["problems"]
    assert generations["succeeded"] >= 10, generations
    assert schedule["fired_twice"] == 0 and schedule["skipped"] == 0, schedule
    assert schedule["ticks_in_run"] >= 0.9 * schedule["expected_ticks"], schedule
    assert schedule["not_succeeded"] == 0, schedule
    assert batch == ("succeeded", BATCH_ROWS), batch
    assert control["held_by_ctl1_at_freeze"], control  # started first (FleetStack.start)
    assert control["takeover_s"] is not None and control["takeover_s"] <= 2 * SWEEP_S, control
    assert control["ctl1_held_it_again_after_thaw"] is False, control
    assert control["ctl1_stood_by_after_thaw"], control


class LeaseWatch:
    """Who holds the control lease, sampled every half second through the run."""

    def __init__(self, engine: sa.Engine) -> None:
        self.samples: list[tuple[float, str | None]] = []
        self._stop = threading.Event()
        self._engine = engine
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.samples.append((time.time(), lease_holder(self._engine)))
            except sa.exc.DBAPIError:
                self.samples.append((time.time(), "(database down)"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def takeover(self, frozen: Fault, host: str, stack: FleetStack) -> dict[str, Any]:
        """How long after `host` froze another host held the lease; whether the
        thawed host held it again, and what its beat said after the thaw."""
        before = [h for t, h in self.samples if t <= frozen.start]
        held = bool(before) and (before[-1] or "").startswith(f"{host}:")
        taken = next((t for t, h in self.samples if t > frozen.start and h
                      and not h.startswith(f"{host}:") and "(" in h), None)  # fmt: skip
        after = [h for t, h in self.samples if t > frozen.end + 1]
        beat = stack.log_tail(host, "beat", 10_000_000)
        fenced = sum(stack.log_tail(name, "control", 10_000_000).count("not run further")
                     for name in ("ctl1", "ctl2"))  # fmt: skip
        return {
            "held_by_ctl1_at_freeze": held,
            "takeover_s": None if taken is None else round(taken - frozen.start, 1),
            "ctl1_held_it_again_after_thaw": any((h or "").startswith(f"{host}:") for h in after),
            "ctl1_stood_by_after_thaw": "stands by" in beat,
            "sweeps_fenced": fenced,
            "terms": sorted({h for _, h in self.samples if h and "term" in h}),
        }


def lease_holder(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT holder, token FROM control_leases WHERE expires_at > now()")
        ).first()
    return None if row is None else f"{row[0]} (term {row[1]})"
