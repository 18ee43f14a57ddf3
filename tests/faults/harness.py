"""A whole service on loopback for fault injection, and a Jepsen-style tally.

Each scenario gets its own stack: a private PostgreSQL (pgserver) and Redis
(AOF on) under its own folder, the API (granian), Celery workers and beat as
real processes, with short leases and sweeps so recovery fits in a test. A
stack with guards off starts its workers and beat from the suite's own entry
point (tests.faults.worker), which builds their container with those guards
off; with every guard on they are the service's own (workers.worker). A
trigger records every change of a job's state, attempt or result into
`fault_log`; the tally is read from there and from the jobs table, not from
what the processes say about themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pgserver
import psutil
import requests
import sqlalchemy as sa

from app.cli.launcher import (
    ENTRY_POINT,
    api_command,
    beat_command,
    control_worker_command,
    worker_command,
)
from app.jobs.guards import Guards
from app.jobs.tables import Job
from app.platform import embedded
from app.platform.database import engine_url
from app.platform.logstreams import RedisLogs
from app.platform.migrate import upgrade
from app.platform.settings import ROOT
from app.tenancy.tables import Tenant
from tests.conftest import QUIET_WORKER
from tests.support import free_port

# The suite's Celery entry point, and the variable it reads the guards to leave off
# from (not imported here: it builds a container and installs a worker's hooks).
FAULT_ENTRY_POINT = "tests.faults.worker"
GUARDS_OFF_VARIABLE = "FAULTS_GUARDS_OFF"
# The stream consumer: the service's, or the suite's where a guard is off or a
# crash is staged (FAULTS_CRASH_AT, see tests.faults.consumer).
STREAM_ENTRY_POINT = "app.streams"
GRPC_ENTRY_POINT = "app.grpc"
FAULT_CONSUMER = "tests.faults.consumer"
# A worker given this variable (a file's path) runs from the suite's entry point, which
# stages crashes in its decode loop at the point the file names (tests.faults.decode_crash).
DECODE_CRASH_VARIABLE = "FAULTS_DECODE_CRASH_FILE"
LANE_CRASH_VARIABLE = "FAULTS_LANE_CRASH_FILE"
# With its guard off, a scenario's jobs at rest this long (no job changed) are where
# they will stay: longer than any wait the remaining guards take (lease 1.5 s,
# republish 3 s, retry backoff 1 s, sweeps every 0.5 s, all in FAST).
SETTLE_S = 6.0
STREAM_FAST = {"STREAMS_REFRESH_SECONDS": "0.2", "STREAMS_CLAIM_IDLE_SECONDS": "1.5"}

TERMINAL = ("succeeded", "failed", "cancelled", "expired")
# Every legal change of status; a repeated status with a new attempt is a re-claim.
LEGAL = {
    ("queued", "running"),
    ("queued", "cancelled"),
    ("queued", "expired"),
    ("running", "running"),
    ("running", "queued"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "expired"),
    ("failed", "queued"),  # a dead letter replayed
}

FAULT_LOG = """
CREATE TABLE fault_log (
    id bigserial PRIMARY KEY, job_id uuid, old_status text, new_status text,
    old_attempts int, new_attempts int, lease_was_live boolean, result_changed boolean,
    at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION log_job_change() RETURNS trigger AS $$ BEGIN
    INSERT INTO fault_log (job_id, old_status, new_status, old_attempts, new_attempts,
                           lease_was_live, result_changed)
    VALUES (NEW.id, OLD.status, NEW.status, OLD.attempts, NEW.attempts,
            OLD.status = 'running' AND OLD.lease_expires_at > now(),
            OLD.output_data IS DISTINCT FROM NEW.output_data);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_fault_log AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.attempts IS DISTINCT FROM NEW.attempts
          OR OLD.output_data IS DISTINCT FROM NEW.output_data)
    EXECUTE FUNCTION log_job_change();
"""

# Short timings so that recovery happens within seconds.
FAST = {
    "JOB_LEASE_SECONDS": "1.5",
    "SWEEP_INTERVAL_SECONDS": "0.5",
    "REPUBLISH_AFTER_SECONDS": "3",
    "RETRY_BACKOFF_SECONDS": "0.2",
    "RETRY_BACKOFF_MAX_SECONDS": "1",
    "BROKER_RESTORE_INTERVAL_SECONDS": "1",
    "SYNC_LANE_LEASE_SECONDS": "1.5",
}


@dataclass
class Tally:
    scenario: str
    guard: str
    jobs: int = 0
    acknowledged: int = 0
    completed: int = 0
    lost: int = 0
    duplicate_executions: int = 0
    duplicate_results: int = 0
    illegal_transitions: int = 0
    recovery_s: float | None = None
    notes: list[str] = field(default_factory=list)
    # Generation scenarios: tokens the streams followed got twice, or never (None:
    # the scenario follows no stream).
    duplicate_tokens: int | None = None
    missing_tokens: int | None = None


_TEMPLATE: list[Path] = []


def template_pgdata() -> Path:
    """A PostgreSQL data folder initialised, migrated and given the fault log once a
    run, then stopped cleanly: each stack's cluster starts from a copy of it rather
    than from initdb and every migration."""
    if not _TEMPLATE:
        root = ROOT / "var" / "test" / f"fault-template-{uuid.uuid4().hex[:8]}"
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        url = embedded.start_postgres(root)
        upgrade(url)
        engine = sa.create_engine(engine_url(url))
        with engine.begin() as conn:
            conn.exec_driver_sql(FAULT_LOG)
        engine.dispose()
        server = pgserver.get_server(root / "pg")
        server.cleanup()  # a clean stop: the copies need no recovery
        atexit.unregister(server._cleanup)
        _TEMPLATE.append(root / "pg")
    return _TEMPLATE[0]


def copy_template(pgdata: Path) -> None:
    """The template cluster into `pgdata` (which may be a mount point already),
    owners and modes kept (the server runs as its own user)."""
    pgdata.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", f"{template_pgdata()}/.", str(pgdata)], check=True)
    (pgdata / ".handle_pids.json").unlink(missing_ok=True)  # the template's handles


def settled(
    probe: Callable[[], Any], done: Callable[[Any], bool], timeout: float, settle: bool
) -> bool:
    """Poll `probe()` until `done` of what it returns, and say so; False past
    `timeout` or, with `settle`, once what it returns has not changed for SETTLE_S
    (a scenario with its guard off shows its loss at rest, not at a timeout)."""
    start = changed = time.monotonic()
    seen: Any = object()
    while time.monotonic() - start < timeout:
        now = probe()
        if done(now):
            return True
        if now != seen:
            seen, changed = now, time.monotonic()
        elif settle and time.monotonic() - changed >= SETTLE_S:
            return False
        time.sleep(0.2)
    return False


class Service:
    """One process of the stack, in its own session so it can be killed as a group."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.args, self.env = name, args, env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        return self

    def wait_for_log(self, needle: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log_path.read_bytes():
            assert self.proc is not None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the whole process group, as the OOM killer or a power cut would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class FaultStack:
    def __init__(
        self, root: Path, model_repository: Path, guards_off: str = "", **env: str
    ) -> None:
        """`guards_off`: a comma list of the guards the workers and beat run without."""
        names = [name.strip() for name in guards_off.split(",") if name.strip()]
        Guards.off(*names)  # a name that is no guard fails here, not in a worker
        # The suite's entry point only where a guard is off: the guard-on figures
        # are those of the service's own processes.
        self.entry_point = FAULT_ENTRY_POINT if names else ENTRY_POINT
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.redis = embedded.start_redis(root)
        copy_template(root / "pg")
        self.database_url = embedded.start_postgres(root)
        self.pg = pgserver.get_server(root / "pg")  # the handle start_postgres opened
        self.engine = sa.create_engine(
            engine_url(self.database_url), pool_size=20, pool_pre_ping=True
        )
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            **FAST,
            **env,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": embedded.redis_url(root),
            "MODEL_REPOSITORY": str(model_repository),
            "VAR_DIR": str(root),
            "JOBS_QUEUE": "inference",
            GUARDS_OFF_VARIABLE: ",".join(names),
            "PYTHONUNBUFFERED": "1",
        }
        self.services: dict[str, Service] = {}
        self.api_key = self._api_key()

    def _api_key(self) -> str:
        from app.tenancy.keys import create_api_key

        with sa.orm.Session(self.engine) as session, session.begin():
            return create_api_key(session, "faults").api_key

    # Processes -----------------------------------------------------------------
    def start_worker(self, name: str = "worker", concurrency: int = 2, **env: str) -> Service:
        """`env`: variables this worker alone gets (a URL through a proxy the test cuts,
        DECODE_CRASH_VARIABLE, LANE_CRASH_VARIABLE)."""
        hostname = f"{name}-{uuid.uuid4().hex[:6]}@%h"
        staged = DECODE_CRASH_VARIABLE in env or LANE_CRASH_VARIABLE in env
        entry_point = FAULT_ENTRY_POINT if staged else self.entry_point
        args = worker_command("inference", concurrency, hostname, *QUIET_WORKER, app=entry_point)
        service = Service(name, args, {**self.env, **env}, self.root).start()
        service.wait_for_log(b" ready.")
        self._wait_serving(service)
        self.services[name] = service
        return service

    def _wait_serving(self, service: Service, timeout: float = 60) -> None:
        """Until a child of the worker serves the queue (the lane refuses calls of a
        queue no worker serves)."""
        from app.platform.broker import redis_client
        from app.sync.lane import serving_key

        client, deadline = redis_client(self.env["REDIS_URL"]), time.monotonic() + timeout
        while not client.exists(serving_key("inference")):
            if time.monotonic() > deadline:
                raise RuntimeError("no worker child serves the queue:\n" + service.log_tail())
            time.sleep(0.05)

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`python manage.py ARGS` against this stack, as an operator runs it."""
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def start_beat(self) -> Service:
        """Beat, with the control worker that runs what it sends (its sweeps)."""
        if "control" not in self.services:
            hostname = f"control-{uuid.uuid4().hex[:6]}@%h"
            args = control_worker_command("control", hostname, *QUIET_WORKER,
                                          app=self.entry_point)  # fmt: skip
            control = Service("control", args, self.env, self.root).start()
            control.wait_for_log(b" ready.")
            self.services["control"] = control
        args = beat_command(
            self.root / "beat-schedule", "--max-interval", "1", app=self.entry_point
        )
        service = Service("beat", args, self.env, self.root).start()
        service.wait_for_log(b"beat: Starting")
        self.services["beat"] = service
        return service

    def start_api(self) -> Service:
        service = Service("api", api_command(f"127.0.0.1:{self.port}"), self.env, self.root)
        service.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.base}/v2/health/live", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("API did not start:\n" + service.log_tail())
            time.sleep(0.1)
        self.services["api"] = service
        return service

    def start_all(self, workers: int = 1, concurrency: int = 2) -> None:
        """The API, the workers and beat, started at once and each waited for: their
        start-ups (imports, models loaded) overlap."""
        with ThreadPoolExecutor(workers + 2) as pool:
            started = [pool.submit(self.start_api), pool.submit(self.start_beat)]
            started += [pool.submit(self.start_worker, f"worker{i}", concurrency)
                        for i in range(workers)]  # fmt: skip
            for each in started:
                each.result()

    def start_consumer(self, name: str = "consumer", crash_at: str = "", **env: str) -> Service:
        """A stream consumer process; with `crash_at` (`accepted:3`, `published:2`) it
        SIGKILLs itself at that checkpoint (tests.faults.consumer)."""
        staged = bool(crash_at) or self.entry_point != ENTRY_POINT
        module = FAULT_CONSUMER if staged else STREAM_ENTRY_POINT
        env = {**self.env, **STREAM_FAST, "FAULTS_CRASH_AT": crash_at, **env}
        service = Service(name, [sys.executable, "-m", module], env, self.root).start()
        service.wait_for_log(b" ready")
        self.services[name] = service
        return service

    def start_grpc(self) -> Service:
        """The gRPC door (`python -m app.grpc`) on a free port: `grpc_target`."""
        self.grpc_target = f"127.0.0.1:{free_port()}"
        env = {**self.env, "GRPC_PORT": self.grpc_target.rsplit(":", 1)[1]}
        service = Service("grpc", [sys.executable, "-m", GRPC_ENTRY_POINT], env, self.root)
        service.start().wait_for_log(b"gRPC door on")
        self.services["grpc"] = service
        return service

    def keep_logs(self, where: Path) -> None:
        """After a failed scenario: its processes' logs copied to `where` (the stack's
        own folder goes), and their tails printed into the test's report."""
        where.mkdir(parents=True, exist_ok=True)
        for name, service in self.services.items():
            if service.log_path.exists():
                shutil.copy(service.log_path, where / service.log_path.name)
                print(f"----- {name} (last lines; whole log in {where}) -----")
                print(service.log_tail(4000))

    def close(self) -> None:
        for service in self.services.values():
            service.kill()
        self.engine.dispose()
        if self.redis is not None:
            self.kill_redis()  # (its data goes with the folder: nothing to flush)
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop_postgres()  # immediate: no checkpoint for a cluster about to go
        self.pg.cleanup()  # drops this process's handle
        atexit.unregister(self.pg._cleanup)
        shutil.rmtree(self.root, ignore_errors=True)

    # Faults --------------------------------------------------------------------
    def kill_redis(self) -> None:
        assert self.redis is not None
        self.redis.kill()
        self.redis.wait()

    def restart_redis(self, *, keep_data: bool = True) -> None:
        if not keep_data:
            for path in (self.root / "redis").glob("appendonly*"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        self.redis = embedded.start_redis(self.root)

    def restore_visible(self, visibility_timeout_s: float) -> None:
        """Put back unacknowledged messages older than the visibility timeout, with the
        call a kombu consumer makes (its periodic timer did not fire in our runs)."""
        from kombu import Connection

        url = self.env["REDIS_URL"].replace("unix://", "redis+socket://", 1)
        options = {"visibility_timeout": visibility_timeout_s}
        with Connection(url, transport_options=options) as conn:
            conn.default_channel.qos.restore_visible(interval=1)

    def stop_postgres(self) -> None:
        """`pg_ctl stop -m immediate`: no checkpoint, like a crash."""
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self.pg.pgdata, user=self.pg.system_user)

    def start_postgres(self) -> None:
        with self.pg._lock:
            self.pg.ensure_postgres_running()

    # The stream door ------------------------------------------------------------
    def bind(self, input_log: str, output_log: str) -> dict[str, Any]:
        """A binding of `digits` for the suite's tenant; its full log names."""
        response = requests.post(
            f"{self.base}/streams",
            json={"model": "digits", "input": input_log, "output": output_log},
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=30,
        )
        assert response.status_code == 201, response.text
        binding: dict[str, Any] = response.json()
        return binding

    def logs(self) -> RedisLogs:
        return RedisLogs.from_url(self.env["REDIS_URL"])

    def wait_outputs(
        self, log: str, count: int, timeout: float, settle: bool = False
    ) -> float | None:
        """Seconds until the log holds `count` entries, or None if it never did (by
        `timeout`, or with `settle` once it has not grown for SETTLE_S)."""
        client, start = self.logs().client, time.monotonic()
        if settled(lambda: client.xlen(log), lambda length: length >= count, timeout, settle):
            return time.monotonic() - start
        return None

    def stream_tally(
        self, scenario: str, guard: str, binding: dict[str, Any], request_ids: list[str]
    ) -> Tally:
        """What became of each appended entry, from the database and the output log:
        completed (a succeeded output entry), lost (no output entry), duplicate
        executions (jobs beyond one per entry, and second claims of a live job),
        duplicate results (output entries beyond one per entry)."""
        outputs: Counter[str] = Counter()
        succeeded: set[str] = set()
        for _, fields in self.logs().client.xrange(binding["output"]):
            request_id = fields[b"id"].decode()
            outputs[request_id] += 1
            if fields[b"status"] == b"succeeded":
                succeeded.add(request_id)
        with self.engine.connect() as conn:
            job_ids = [str(i) for i in conn.execute(sa.text("SELECT id FROM jobs")).scalars()]
            recorded = conn.scalar(
                sa.text("SELECT count(DISTINCT request_id) FROM stream_entries "
                        "WHERE binding_id = :b"), {"b": binding["id"]},
            )  # fmt: skip
        tally = self.tally(scenario, guard, job_ids, len(request_ids))
        tally.acknowledged = len(request_ids)
        tally.completed = sum(i in succeeded for i in request_ids)
        tally.lost = sum(outputs[i] == 0 for i in request_ids)
        tally.duplicate_executions += len(job_ids) - int(recorded or 0)
        tally.duplicate_results += sum(c - 1 for c in outputs.values() if c > 1)
        return tally

    # Traffic -------------------------------------------------------------------
    def insert_queued(self, inputs: list[dict[str, Any]]) -> list[str]:
        """Committed `queued` rows with no message sent, as a crash after the commit
        of POST /jobs leaves them (or as a test stages a race)."""
        with sa.orm.Session(self.engine) as session:
            tenant_id = session.scalar(sa.select(Tenant.id).where(Tenant.name == "faults"))
            assert tenant_id is not None
            jobs = [
                Job(
                    id=uuid.uuid4(),
                    tenant_id=tenant_id,
                    model="digits",
                    model_version="1",
                    status="queued",
                    inputs=row,
                    attempts=0,
                )
                for row in inputs
            ]
            session.add_all(jobs)
            session.commit()
            return [str(job.id) for job in jobs]

    def submit(self, bodies: list[dict[str, Any]], clients: int = 8) -> list[str]:
        """POST every body; returns the ids of the acknowledged (202) jobs."""
        headers = {"Authorization": f"Bearer {self.api_key}"}

        def post(body: dict[str, Any]) -> str | None:
            try:
                r = requests.post(f"{self.base}/jobs", json=body, headers=headers, timeout=30)
            except requests.RequestException:
                return None
            return str(r.json()["id"]) if r.status_code == 202 else None

        with ThreadPoolExecutor(clients) as pool:
            return [i for i in pool.map(post, bodies) if i is not None]

    def statuses(self, ids: list[str]) -> dict[str, str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT id::text, status FROM jobs WHERE id::text = ANY(:ids)"),
                {"ids": ids},
            )
            return {r[0]: r[1] for r in rows}

    def wait_terminal(self, ids: list[str], timeout: float, settle: bool = False) -> float | None:
        """Seconds until every job is terminal, or None if some never got there: by
        `timeout`, or, with `settle`, once no job has changed at all (status, attempt
        or result) for SETTLE_S. A scenario with its guard off proves its loss that
        way, at rest, rather than by waiting out a timeout."""
        start = time.monotonic()

        def seen() -> tuple[int, dict[str, str]]:
            return (self._last_change() if settle else 0), self.statuses(ids)

        def done(now: tuple[int, dict[str, str]]) -> bool:
            statuses = now[1]
            return len(statuses) == len(ids) and all(s in TERMINAL for s in statuses.values())

        if settled(seen, done, timeout, settle):
            return time.monotonic() - start
        return None

    def _last_change(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.scalar(sa.text("SELECT coalesce(max(id), 0) FROM fault_log")) or 0)

    def tally(
        self, scenario: str, guard: str, ids: list[str], attempted: int, expect: str = "succeeded"
    ) -> Tally:
        statuses = self.statuses(ids)
        with self.engine.connect() as conn:
            log = conn.execute(
                sa.text(
                    "SELECT job_id::text, old_status, new_status, old_attempts, new_attempts, "
                    "lease_was_live, result_changed FROM fault_log WHERE job_id::text = ANY(:ids)"
                ),
                {"ids": ids},
            ).all()
        results: dict[str, int] = {}
        duplicate_executions = illegal = 0
        for row in log:
            if row.new_attempts > row.old_attempts and row.lease_was_live:
                duplicate_executions += 1
            if row.new_status in TERMINAL and (
                row.result_changed or row.old_status not in TERMINAL
            ):
                results[row.job_id] = results.get(row.job_id, 0) + 1
            if row.old_status != row.new_status and (row.old_status, row.new_status) not in LEGAL:
                illegal += 1
        return Tally(
            scenario=scenario,
            guard=guard,
            jobs=attempted,
            acknowledged=len(ids),
            completed=sum(statuses.get(i) == expect for i in ids),
            lost=sum(statuses.get(i) not in TERMINAL for i in ids),
            duplicate_executions=duplicate_executions,
            duplicate_results=sum(count - 1 for count in results.values() if count > 1),
            illegal_transitions=illegal,
        )
