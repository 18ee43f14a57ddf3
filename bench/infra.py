"""The servers every contender shares, and one private slice of them per contender.

With `DATABASE_URL` / `REDIS_URL` set the bench uses those servers; otherwise it
starts the project's embedded PostgreSQL and Redis (`app.platform.embedded`) under
`var/bench`, so a run needs nothing installed on the machine. Each contender
gets a fresh database (dropped afterwards) and its own Redis database number,
so no contender finds another's rows, queues or flags.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg2
import redis
from sqlalchemy.engine import make_url

from app.platform import embedded
from app.platform.settings import ROOT

logger = logging.getLogger(__name__)

VAR_DIR = ROOT / "var" / "bench"


@dataclass(frozen=True)
class RedisDb:
    """One Redis database number, spelled for redis-py and for kombu.

    kombu ignores `?db=N` on a `redis+socket://` URL (it reads `virtual_host`), so
    the two spellings differ for unix sockets.
    """

    base_url: str  # redis://host:port[/n] or unix:///path.sock, as REDIS_URL is spelled
    db: int

    @property
    def client_url(self) -> str:
        if self.base_url.startswith("unix://"):
            return f"{_strip_query(self.base_url)}?db={self.db}"
        return f"{_strip_db(self.base_url)}/{self.db}"

    @property
    def broker_url(self) -> str:
        if self.base_url.startswith("unix://"):
            path = _strip_query(self.base_url)[len("unix://") :]
            return f"redis+socket://{path}?virtual_host={self.db}"
        return self.client_url

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.client_url, socket_timeout=10)


def _strip_query(url: str) -> str:
    return url.split("?", 1)[0]


def _strip_db(url: str) -> str:
    return re.sub(r"/\d+$", "", _strip_query(url))


@dataclass(frozen=True)
class Database:
    """A contender's own PostgreSQL database."""

    name: str
    url: str  # SQLAlchemy URL, as DATABASE_URL is spelled

    @property
    def psycopg2_url(self) -> str:
        """For the bench's own SQLAlchemy engines: SQLAlchemy 2.1 reads a bare
        `postgresql://` as psycopg 3, which is not installed."""
        return make_url(self.url).set(drivername="postgresql+psycopg2").render_as_string(False)

    @property
    def dsn(self) -> str:
        """The same URL for psycopg2 / libpq (no `+driver`)."""
        return make_url(self.url).set(drivername="postgresql").render_as_string(False)

    def connect(self) -> psycopg2.extensions.connection:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        return conn


class Servers:
    """PostgreSQL and Redis for the whole run: the machine's own when the
    environment names them, else the embedded ones, started here and stopped
    when the run ends."""

    def __init__(self, var_dir: Path = VAR_DIR) -> None:
        self.var_dir = var_dir
        self.redis_proc: subprocess.Popen[bytes] | None = None
        self.embedded_postgres = not os.environ.get("DATABASE_URL")
        self.embedded_redis = not os.environ.get("REDIS_URL")
        self.admin_url = ""
        self.redis_url = ""

    def __enter__(self) -> Servers:
        self.var_dir.mkdir(parents=True, exist_ok=True)
        if self.embedded_postgres:
            # Keeps a pgserver handle in this process: PostgreSQL stops when it exits.
            self.admin_url = embedded.start_postgres(self.var_dir)
        else:
            self.admin_url = os.environ["DATABASE_URL"]
        if self.embedded_redis:
            self.redis_proc = embedded.start_redis(self.var_dir)
            self.redis_url = embedded.redis_url(self.var_dir)
        else:
            self.redis_url = os.environ["REDIS_URL"]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.redis_proc is not None:
            embedded.stop_redis(self.redis_proc)

    # -- PostgreSQL --------------------------------------------------------------

    def _admin(self) -> psycopg2.extensions.connection:
        return Database("admin", self.admin_url).connect()

    def create_database(self, contender: str, run_id: str) -> Database:
        name = re.sub(r"[^a-z0-9_]", "_", f"bench_{contender}_{run_id}".lower())
        conn = self._admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        url = make_url(self.admin_url).set(database=name).render_as_string(False)
        return Database(name, url)

    def drop_database(self, database: Database) -> None:
        conn = self._admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{database.name}" WITH (FORCE)')
        finally:
            conn.close()

    def postgres_pid(self) -> int | None:
        """The postmaster: the parent of any backend (same machine only), read
        while the backend is alive (once its connection closed it may be gone,
        and the run would leave PostgreSQL's CPU out)."""
        import psutil

        conn = self._admin()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                row = cur.fetchone()
                assert row is not None
                return int(psutil.Process(row[0]).ppid())
        except psutil.Error:
            return None
        finally:
            conn.close()

    def postgres_version(self) -> str:
        row = self._admin_row("SHOW server_version")
        return str(row[0]) if row else "?"

    def _admin_row(self, sql: str) -> tuple[Any, ...] | None:
        conn = self._admin()
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                row: tuple[Any, ...] | None = cur.fetchone()
                return row
        finally:
            conn.close()

    # -- Redis -------------------------------------------------------------------

    def redis_db(self, db: int) -> RedisDb:
        """Database `db` of the shared Redis, emptied: the numbers the bench picks
        (see `bench.contenders`) belong to it for the run."""
        slot = RedisDb(self.redis_url, db)
        slot.client().flushdb()
        return slot

    def service_redis(self) -> RedisDb:
        """REDIS_URL exactly as the service is given it (its own database number)."""
        match = re.search(r"/(\d+)$", _strip_query(self.redis_url))
        return RedisDb(self.redis_url, int(match.group(1)) if match else 0)

    def redis_info(self) -> dict[str, str]:
        info = redis.Redis.from_url(self.redis_url, socket_timeout=5).info("server")
        return {"version": str(info.get("redis_version")), "pid": str(info.get("process_id"))}
