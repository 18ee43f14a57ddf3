"""`manage.py up`: set everything up, run API, stream consumer, workers, beat and
Flower, supervise them.

The children run in their own process sessions, so Ctrl-C reaches only this
launcher, which then stops them in order (API first, so no new jobs arrive;
worker last, so it finishes what it holds), then the embedded Redis and
PostgreSQL. A child that dies on its own is started again.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import requests

from app.observability import metrics_dir
from app.operations.models import queues_in
from app.platform import embedded
from app.platform.kept_secrets import kept_secret
from app.platform.settings import ROOT, Settings

logger = logging.getLogger("launcher")

RESTART_DELAY_S = 2.0
# A child that exits this soon after starting, this many times in a row, is not
# going to recover by itself (a port in use, a bad setting): stop and say so.
FAST_EXIT_S = 10.0
FAST_EXIT_LIMIT = 3


class LaunchError(RuntimeError):
    pass


# The service's Celery entry point (`celery -A`): its worker, beat and Flower.
ENTRY_POINT = "workers.worker"


def celery_command(app: str = ENTRY_POINT) -> list[str]:
    """`celery -A app`. The Celery commands below take `app` too: an entry point
    other than the service's is for tests (the fault suite's, tests.faults.worker)."""
    return [sys.executable, "-m", "celery", "-A", app]


CELERY = celery_command()
# The Celery workers `make run` starts, in the order their metrics ports are given.
WORKERS = ("worker", "webhooks", "control")


def api_command(bind: str, threads: int = 32) -> list[str]:
    """The API under granian (app.cli.api_server): 2 processes of `threads` request threads,
    so slow clients and open event streams hold a thread, not a process. It sets up
    the multi-process metrics, and JSON logs with LOG_FORMAT=json (where the API logs
    requests itself)."""
    return [
        sys.executable, "-m", "app.cli.api_server", "--bind", bind, "--workers", "2",
        "--threads", str(threads),
    ]  # fmt: skip


def grpc_command() -> list[str]:
    """The gRPC door (app.grpc): KServe v2 on GRPC_HOST:GRPC_PORT, a thread pool over
    its own container; it loads no model (the workers run every job)."""
    return [sys.executable, "-m", "app.grpc"]


def worker_command(
    queue: str, concurrency: int, hostname: str, *extra: str, app: str = ENTRY_POINT
) -> list[str]:
    return [
        *celery_command(app), "worker", "--queues", queue, "--concurrency", str(concurrency),
        "--loglevel", "INFO", "--hostname", hostname, *extra,
    ]  # fmt: skip


def inference_queues(settings: Settings, named: set[str]) -> str:
    """The queues `make run`'s one worker serves, comma-separated: WORKER_QUEUES when
    set; else the default ones and every queue a model in the repository names
    (`named`), so a fresh `make run` runs every model. A queue first named by a
    model added later is served after a restart."""
    if settings.worker_queues:
        return ",".join(settings.worker_queues)
    return ",".join(dict.fromkeys([*settings.inference_queues, *sorted(named)]))


def streams_command() -> list[str]:
    """The stream door's consumer (`python -m app.streams`): reads the bindings' input
    logs, writes their results; more of them share the work (one consumer group)."""
    return [sys.executable, "-m", "app.streams"]


def control_worker_command(
    queue: str, hostname: str, *extra: str, app: str = ENTRY_POINT
) -> list[str]:
    """The control worker: beat's sweeps on their own queue, never behind jobs. Threads:
    sweeps wait on the database, and no model is loaded (no prefork child starts)."""
    return worker_command(queue, 4, hostname, "--pool", "threads", *extra, app=app)


def beat_command(schedule: Path, *extra: str, app: str = ENTRY_POINT) -> list[str]:
    return [*celery_command(app), "beat", "--schedule", str(schedule), "--loglevel", "INFO", *extra]


FLOWER_MAX_TASKS = 2_000


def flower_command(host: str, port: int, *extra: str) -> list[str]:
    """Flower on `host` only (loopback by default). Its login comes from the
    FLOWER_BASIC_AUTH environment variable (never the command line, which `ps`
    shows to every user); with a login set, its API needs the same one. It keeps
    the last FLOWER_MAX_TASKS tasks in memory (its default, 100,000, let it grow
    by megabytes a minute for hours under steady load: bench (n), the soak)."""
    return [*CELERY, "flower", f"--address={host}", f"--port={port}",
            f"--max_tasks={FLOWER_MAX_TASKS}", *extra]  # fmt: skip


FLOWER_USER = "admin"


def flower_login(settings: Settings) -> tuple[str, bool]:
    """Flower's `user:password`, and whether it was made here: FLOWER_BASIC_AUTH,
    else user `admin` with a random password kept in VAR_DIR/flower-password, so a
    browser's saved login goes on working across restarts."""
    if settings.flower_basic_auth:
        return settings.flower_basic_auth, False
    password = kept_secret(settings.var_dir / "flower-password", nbytes=18)
    return f"{FLOWER_USER}:{password}", True


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the service's
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    fast_exits: int = field(default=0)


class Launcher:
    def __init__(
        self,
        settings: Settings,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        flower_port: int = 5555,
        worker_concurrency: int = 2,
    ) -> None:
        self.settings = settings
        self.host, self.port, self.flower_port = host, port, flower_port
        self.worker_concurrency = worker_concurrency
        self.redis: subprocess.Popen[bytes] | None = None
        self.children: list[Child] = []
        self.stopping = False
        self.flower_auth, self.flower_auth_made = "", False
        self.first_key: str | None = None
        self.first_secret: str | None = None

    def run(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        try:
            self._check_ports()
            self._prepare()
            self._start_children()
            self._announce(self._wait_ready())
            while not self.stopping:
                self._supervise_once()
                time.sleep(0.5)
        except LaunchError as exc:
            logger.error("%s", exc)
            raise SystemExit(1) from None
        finally:
            self._stop()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.stopping:
            logger.info("received %s, stopping", signal.Signals(signum).name)
        self.stopping = True

    def _worker_metrics_ports(self) -> dict[str, int]:
        """WORKER_METRICS_PORT for the inference worker, the next two for the webhook
        and control workers, the one after for the gRPC door, unless GRPC_METRICS_PORT
        names its own (none when WORKER_METRICS_PORT is unset)."""
        base = self.settings.worker_metrics_port
        if not base:
            return {}
        ports = {name: base + i for i, name in enumerate(WORKERS)}
        if self.settings.grpc_port:
            ports["grpc"] = self.settings.grpc_metrics_port or base + len(WORKERS)
        return ports

    def _check_ports(self) -> None:
        metrics_ports = [
            (_metrics_of(name), self.host, port, "WORKER_METRICS_PORT")
            for name, port in self._worker_metrics_ports().items()
        ]
        grpc = self.settings.grpc_host, self.settings.grpc_port
        for name, host, port, variable in (
            ("API", self.host, self.port, "PORT"),
            *([("gRPC", *grpc, "GRPC_PORT")] if grpc[1] else []),
            ("Flower", self.host, self.flower_port, "FLOWER_PORT"),
            *metrics_ports,
        ):
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, port))
                except OSError as exc:
                    raise LaunchError(
                        f"the {name} port {host}:{port} is not free ({exc.strerror}); "
                        f"stop what uses it or choose another with {variable}=..."
                    ) from None

    def _prepare(self) -> None:
        from app.container import Container
        from app.platform.migrate import upgrade

        self.settings.var_dir.mkdir(parents=True, exist_ok=True)
        if not self.settings.redis_url:
            self.redis = embedded.start_redis(self.settings.var_dir)
        self.settings = embedded.resolve_urls(self.settings)
        logger.info("database: %s", _redact(self.settings.database_url))
        logger.info("redis:    %s", _redact(self.settings.redis_url))
        # The tables first: the model repository reads its shared states when made.
        upgrade(self.settings.database_url)
        container = Container(self.settings)
        try:
            for path in container.models.build_bundled():
                logger.info("built model in %s", path)
            with container.scope():
                first = container.tenants.first_key()  # the tenant `default`, on a fresh machine
            self.first_key, self.first_secret = (
                (first.api_key, first.webhook_secret) if first else (None, None)
            )
        finally:
            container.close()

    def _start_children(self) -> None:
        named = queues_in(self.settings.model_repository)
        queue, concurrency = inference_queues(self.settings, named), self.worker_concurrency
        logger.info("the worker serves the queues %s", queue)
        self.flower_auth, self.flower_auth_made = flower_login(self.settings)
        # The status page links to this Flower, unless FLOWER_URL names another.
        api_env = {} if self.settings.flower_url else {"FLOWER_URL": self._flower_url()}
        json_logs = self.settings.log_format == "json"
        self.children = [
            Child("api", api_command(f"{self.host}:{self.port}"), api_env),
            # Stopped right after the API: no new jobs from any door while workers finish.
            *([Child("grpc", grpc_command())] if self.settings.grpc_port else []),
            Child("streams", streams_command()),
            Child("worker", worker_command(queue, concurrency, "worker@%h", "--task-events")),
            # Webhook delivery waits on the network: threads, apart from inference.
            Child("webhooks", worker_command(self.settings.webhooks_queue, 8, "webhooks@%h",
                                             "--pool", "threads", "--task-events")),
            # Sweeps (leases, deadlines, due webhooks, schedules, purges): never behind jobs.
            Child("control", control_worker_command(self.settings.control_queue,
                                                    "control@%h", "--task-events")),
            Child("beat", beat_command(self.settings.var_dir / "celerybeat-schedule")),
            Child("flower", flower_command(self.host, self.flower_port),
                  {"FLOWER_BASIC_AUTH": self.flower_auth}),
        ]  # fmt: skip
        ports = self._worker_metrics_ports()
        for child in self.children:
            if child.name in ("api", "grpc", *WORKERS):  # each its own multi-process metrics
                child.env[metrics_dir.ENV] = str(self.settings.var_dir / "metrics" / child.name)
            if child.name == "grpc" and "grpc" in ports:
                child.env["GRPC_METRICS_PORT"] = str(ports["grpc"])
                child.env["WORKER_METRICS_HOST"] = self.host
            elif child.name in ports:
                child.env["WORKER_METRICS_PORT"] = str(ports[child.name])
                child.env["WORKER_METRICS_HOST"] = self.host
            if json_logs and child.args[: len(CELERY)] == CELERY:
                child.args[len(CELERY) : len(CELERY)] = ["--quiet"]  # no banners on stdout
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        env = {**embedded.environment(self.settings), **child.env}
        if metrics_dir.ENV in child.env:  # a new process tree: its counters start at 0
            metrics_dir.clear(Path(child.env[metrics_dir.ENV]))
        child.proc = subprocess.Popen(
            child.args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
        child.started_at = time.monotonic()
        logger.info("started %s (pid %s)", child.name, child.proc.pid)

    def _wait_ready(self, timeout: float = 90) -> bool:
        deadline = time.monotonic() + timeout
        while not self.stopping and time.monotonic() < deadline:
            try:
                url = f"http://{self.host}:{self.port}/v2/health/ready"
                if requests.get(url, timeout=2).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            self._supervise_once()
            time.sleep(0.2)
        return False

    def _announce(self, ready: bool) -> None:
        base = f"http://{self.host}:{self.port}"
        status = "ready" if ready else f"started, but {base}/v2/health/ready does not say ready"
        if self.flower_auth_made:
            user, _, password = self.flower_auth.partition(":")
            login = (
                f"user {user}, password {password}, kept in "
                f"{self.settings.var_dir / 'flower-password'}; FLOWER_BASIC_AUTH=user:pw to choose"
            )
        else:
            login = "login from FLOWER_BASIC_AUTH"
        grpc = self.settings.grpc_port and f"{self.settings.grpc_host}:{self.settings.grpc_port}"
        lines = [
            "",
            f"Inference service {status}: API {base}  (docs {base}/docs, status page {base}/)",
            *([f"gRPC (KServe v2, tritonclient.grpc): {grpc}"] if grpc else []),
            f"Flower {self._flower_url()}  ({login})",
        ]
        if self.first_key:
            lines.append(
                "Your API key and webhook signing secret (tenant 'default', shown once), "
                "ready to paste into your shell:"
            )
        else:
            lines.append(
                "Create an API key: python manage.py create-api-key --tenant NAME, then "
                "export INFERENCE_API_KEY=<the key> beside these lines:"
            )
        lines.append(f"  export INFERENCE_URL={base}")
        if self.first_key:
            lines.append(f"  export INFERENCE_API_KEY={self.first_key}")
            lines.append(f"  export INFERENCE_WEBHOOK_SECRET={self.first_secret}")
        if grpc:
            lines.append(f"  export INFERENCE_GRPC_ADDRESS={grpc}")
        logs = self.settings.logs_url  # the stream door's Redis, unless it holds a password
        if logs and _redact(logs) == logs and "password=" not in logs:
            lines.append(f"  export INFERENCE_REDIS_URL={logs}")
        lines += [
            "Try it (the examples in examples/ read the same variables):",
            '  curl -s -X POST "$INFERENCE_URL/jobs" -H "Authorization: Bearer $INFERENCE_API_KEY" '
            "-H 'Content-Type: application/json' "
            '-d \'{"model": "digits", "inputs": {"pixels": [[0,0,5,13,9,1,0,0,0,0,13,15,'
            "10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,"
            "0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]]}}'",
            '  curl -s "$INFERENCE_URL/jobs/<id>" -H "Authorization: Bearer $INFERENCE_API_KEY"',
            "Press Ctrl-C to stop.",
            "",
        ]
        print("\n".join(lines), flush=True)

    def _flower_url(self) -> str:
        return f"http://{self.host}:{self.flower_port}"

    def _supervise_once(self) -> None:
        """Start again each child that exited; give up on one that cannot stay up."""
        for child in self.children:
            assert child.proc is not None
            code = child.proc.poll()
            if code is None or self.stopping:
                continue
            quick = time.monotonic() - child.started_at < FAST_EXIT_S
            child.fast_exits = child.fast_exits + 1 if quick else 0
            if child.fast_exits >= FAST_EXIT_LIMIT:
                raise LaunchError(
                    f"{child.name} exited {child.fast_exits} times within {FAST_EXIT_S:.0f}s "
                    f"of starting (last exit code {code}); its output above says why"
                )
            child.restarts += 1
            logger.warning(
                "%s exited with %s; restarting (restart #%d)", child.name, code, child.restarts
            )
            time.sleep(RESTART_DELAY_S)
            if not self.stopping:
                self._spawn(child)

    def _stop(self) -> None:
        self.stopping = True
        for child in self.children:  # API first, worker before beat and Flower
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
                _wait(child.name, child.proc, 30)
        if self.redis is not None:
            embedded.stop_redis(self.redis)
            logger.info("stopped embedded Redis")
        # The embedded PostgreSQL stops when this process, its last handle, exits.


def _metrics_of(child: str) -> str:
    return f"{child} worker's metrics" if child in WORKERS else f"{child} door's metrics"


def _wait(name: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not stop in %ss; killing it", name, timeout)
        proc.kill()
        proc.wait()
    logger.info("stopped %s", name)


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest.split("/")[0]:
        creds, _, host = rest.partition("@")
        user = creds.split(":")[0]
        return f"{scheme}{sep}{user}:***@{host}"
    return url
