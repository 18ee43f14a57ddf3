"""The service on a fleet of hosts, started as production starts it.

Each host runs the commands of `docker-compose.yml`'s services, configured only by
URLs and settings: `data` PostgreSQL and Redis (behind the delay proxy), `api1`
and `api2` the API, `w1`..`w3` an inference worker each, `ctl1` and `ctl2` beat,
the control worker, the webhook worker and the stream consumer each, `client` the
load. Every host but `data` and `client` has a CPU quota, so one saturates
visibly on two cores; the model repository and the tenants' data area are one
folder, as the shared volume of a real fleet.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import sqlalchemy as sa

from app.platform.database import engine_url
from modelbuild.bundled import ensure_models
from tests.fleet.data import DataServers
from tests.fleet.hosts import Fleet, Host

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
API_PORT = 8000

# Cores per host: an API host saturates at half a core, a worker or control host at
# a fifth; PostgreSQL, Redis and the load client are not capped.
CPU = {"api": 0.5, "w": 0.2, "ctl": 0.25}
WORKER_HOSTS = ("w1", "w2", "w3")
API_HOSTS = ("api1", "api2")
CONTROL_HOSTS = ("ctl1", "ctl2")

# Short leases and sweeps, so faults heal within a run of minutes (the defaults are
# 60 s and 5 s); the same on every host, as one configuration of a real fleet.
SETTINGS = {
    "JOB_LEASE_SECONDS": "6",
    "SWEEP_INTERVAL_SECONDS": "2",
    "CONTROL_LEASE_SECONDS": "2",
    "REPUBLISH_AFTER_SECONDS": "5",
    "SYNC_LANE_LEASE_SECONDS": "3",
    "BROKER_RESTORE_INTERVAL_SECONDS": "2",
    "RETRY_BACKOFF_SECONDS": "0.5",
    "RETRY_BACKOFF_MAX_SECONDS": "4",
    "ORT_INTRA_OP_THREADS": "1",
    "SCHEDULE_TICK_SECONDS": "1",
    "LOG_FORMAT": "text",
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
    "MAX_WAITS": "24",
    "MAX_WAITS_PER_TENANT": "24",
}


class FleetStack:
    def __init__(
        self, root: Path, models: tuple[str, ...] = ("digits", "heavy"), **env: str
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.fleet = Fleet(root / "fleet")
        self.data_host = self.fleet.add_host("data")
        for name in API_HOSTS:
            self.fleet.add_host(name, CPU["api"])
        for name in WORKER_HOSTS:
            self.fleet.add_host(name, CPU["w"])
        for name in CONTROL_HOSTS:
            self.fleet.add_host(name, CPU["ctl"])
        self.client_host = self.fleet.add_host("client")
        self.data = DataServers(self.data_host, root / "data")
        self.data.start()
        self.models = root / "models"
        ensure_models(ROOT / "models")
        for model in models:
            shutil.copytree(ROOT / "models" / model, self.models / model, dirs_exist_ok=True)
        self.env = {
            "PATH": f"{Path(PYTHON).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(root),
            "DATABASE_URL": self.data.database_url,
            "REDIS_URL": self.data.redis_url,
            "MODEL_REPOSITORY": str(self.models),
            "DATA_DIR": str(root / "tenant-data"),
            # Shared by every host, as S3 or a shared volume would be: an upload the
            # API took is the file a worker splits.
            "FILE_STORE_URL": str(root / "files"),
            "SECRET_KEY": "fleet-secret",
            **SETTINGS,
            **env,
        }
        ctl1 = self.fleet.host("ctl1")
        self.manage(ctl1, "db", "upgrade")
        created = self.manage(ctl1, "create-api-key", "--tenant", "fleet", "--json")
        self.api_key: str = json.loads(created)["api_key"]
        self.auth = {"Authorization": f"Bearer {self.api_key}"}

    # Hosts ----------------------------------------------------------------------
    def host(self, name: str) -> Host:
        return self.fleet.host(name)

    def host_env(self, host: Host, **extra: str) -> dict[str, str]:
        var = self.root / "var" / host.name
        var.mkdir(parents=True, exist_ok=True)
        return {**self.env, "VAR_DIR": str(var), **extra}

    def manage(self, host: Host, *args: str) -> str:
        """`python manage.py ARGS` on `host`, as an operator runs it there."""
        done = host.run([PYTHON, "manage.py", *args], 300, self.host_env(host), ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} on {host.name}: {done.stderr}")
        return done.stdout

    def url(self, api_host: str) -> str:
        return f"http://{self.host(api_host).address}:{API_PORT}"

    # The compose services, host by host ---------------------------------------------
    def start_api(self, name: str) -> None:
        host = self.host(name)
        args = [PYTHON, "-m", "app.cli.api_server", "--bind", f"0.0.0.0:{API_PORT}",
                "--workers", "2", "--threads", "16"]  # fmt: skip
        host.spawn("api", args, self.host_env(host), cwd=ROOT)

    def start_worker(self, name: str, concurrency: int = 1) -> None:
        host = self.host(name)
        env = self.host_env(host, WORKER_QUEUES="inference", WORKER_CONCURRENCY=str(concurrency))
        args = [PYTHON, "manage.py", "worker", "--hostname", "worker@%h", "--task-events",
                "--loglevel", "INFO"]  # fmt: skip
        host.spawn("worker", args, env, cwd=ROOT)

    def start_control(self, name: str) -> None:
        """Beat, the control worker, the webhook worker and the stream consumer (two
        Celery workers on one host: each named, where compose's containers are by
        their hostnames)."""
        host = self.host(name)
        env = self.host_env(host)
        celery = [PYTHON, "-m", "celery", "-A", "workers.worker"]
        schedule = str(self.root / "var" / name / "celerybeat-schedule")
        host.spawn("beat", [*celery, "beat", "--schedule", schedule, "--loglevel", "INFO"], env,
                   cwd=ROOT)  # fmt: skip
        host.spawn("control", [*celery, "worker", "--queues", "control", "--pool", "threads",
                               "--concurrency", "4", "--hostname", f"control@{name}",
                               "--loglevel", "INFO"], env, cwd=ROOT)  # fmt: skip
        host.spawn("streams", [PYTHON, "manage.py", "streams", "run"], env, cwd=ROOT)
        host.spawn("webhooks", [*celery, "worker", "--queues", "webhooks", "--pool", "threads",
                                "--concurrency", "16", "--hostname", f"webhooks@{name}",
                                "--loglevel", "INFO"], env, cwd=ROOT)  # fmt: skip

    def start(self, workers: tuple[str, ...] = WORKER_HOSTS, concurrency: int = 1) -> None:
        for name in API_HOSTS:
            self.start_api(name)
        for name in workers:
            self.start_worker(name, concurrency)
        first, *others = CONTROL_HOSTS
        self.start_control(first)  # it holds the control lease; the others stand by
        self.wait_log(first, "beat", "holds it")
        for name in others:
            self.start_control(name)
        for name in API_HOSTS:
            self.wait_ready(name)
        self.wait_serving(workers)

    def wait_ready(self, api_host: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        url = f"{self.url(api_host)}/v2/health/ready"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{api_host} not ready:\n{self.log_tail(api_host, 'api')}")
            time.sleep(0.2)

    def wait_serving(self, workers: tuple[str, ...], timeout: float = 180) -> None:
        """Until each worker host's Celery worker says it is ready."""
        for name in workers:
            self.wait_log(name, "worker", " ready.", timeout)

    def wait_log(self, host: str, name: str, needle: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log_tail(host, name, 10_000_000):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host} {name}: no {needle!r}:\n{self.log_tail(host, name)}")
            time.sleep(0.3)

    def log_tail(self, host: str, name: str, chars: int = 3000) -> str:
        path = self.fleet.root / "logs" / f"{host}-{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def engine(self) -> sa.Engine:
        """The test's own connections to the data host (through the proxy), pinged
        before use: PostgreSQL restarts during the fault run."""
        return sa.create_engine(engine_url(self.data.database_url), pool_pre_ping=True)

    def cpu_seconds(self) -> dict[str, float]:
        return {name: host.cpu_seconds() for name, host in self.fleet.hosts.items()}

    def close(self) -> None:
        self.fleet.close()
