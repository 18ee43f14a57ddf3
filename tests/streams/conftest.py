"""The stream door on real parts: Redis Streams (this run's Redis, and the embedded
6.2 where a test says so), PostgreSQL, Celery worker processes and real consumer
processes (`python -m app.streams`), with short refresh and claim times."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import redis
import sqlalchemy as sa
from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.platform import embedded
from app.platform.database import Database
from app.platform.logstreams import RedisLogs
from app.platform.settings import ROOT, Settings
from app.repository.registry import ModelRepository
from tests.conftest import RUN_ID, TenantAuth, service_env, stop_process
from tests.support import process_started, starts_processes, wait_until

DIGITS = load_digits().data.astype(np.float32)
FAST = {"STREAMS_REFRESH_SECONDS": "0.2", "STREAMS_CLAIM_IDLE_SECONDS": "1.5"}
SERVICE_ENTRY = "app.streams"


class ConsumerProcess:
    """A real stream consumer: `python -m <module>` (the service's, or the fault
    suite's entry point), its output in `log_path`."""

    def __init__(
        self, settings: Settings, log_path: Path, *, module: str = SERVICE_ENTRY, **env: str
    ) -> None:
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=service_env(settings, **{**FAST, **env}),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        process_started()
        wait_until(self._ready, lambda: "consumer ready:\n" + self.tail(), 60)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError("consumer did not start:\n" + self.tail())
        return b"ready" in self.log_path.read_bytes()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL, as the OOM killer would."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc, 30)
        self.log.close()


@pytest.fixture(scope="session")
def embedded_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The embedded Redis 6.2 (what `make run` starts where no REDIS_URL is set),
    one for the session's tests that check the oldest server the door supports."""
    folder: Path = tmp_path_factory.mktemp("redis62")
    server = embedded.start_redis(folder)
    yield embedded.redis_url(folder)
    if server is not None:
        embedded.stop_redis(server)


@pytest.fixture
@starts_processes
def start_consumer(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    """`start_consumer(**env)`: one more consumer process, stopped after the test."""
    started: list[ConsumerProcess] = []

    def start(name: str = "consumer", **env: str) -> ConsumerProcess:
        started.append(ConsumerProcess(settings, tmp_path / f"{name}-{len(started)}.log", **env))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def consumer(start_consumer: Callable[..., ConsumerProcess]) -> ConsumerProcess:
    return start_consumer()


@pytest.fixture(scope="session")
def logs(settings: Settings) -> Iterator[RedisLogs]:
    """The run's Redis as the door sees it; this run's logs deleted at the end."""
    engine = RedisLogs.from_url(settings.redis_url)
    yield engine
    keys = list(engine.client.scan_iter(match=f"{settings.streams_prefix}:*", count=1000))
    keys += list(engine.client.scan_iter(match="inference:stream-*", count=1000))
    for start in range(0, len(keys), 500):
        engine.client.delete(*keys[start : start + 500])


def bind(client: FlaskClient, tenant: TenantAuth, **fields: Any) -> dict[str, Any]:
    body = {"model": "digits", "input": f"in-{RUN_ID}", "output": f"out-{RUN_ID}", **fields}
    response = client.post("/streams", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.json
    binding: dict[str, Any] = response.json  # type: ignore[assignment]
    return binding


def request(i: int, **extra: Any) -> dict[str, Any]:
    """An input entry of one digits row (row i of the set, cycling)."""
    row = DIGITS[i % len(DIGITS)].tolist()
    return {"id": f"r{i}", "inputs": json.dumps({"pixels": [row]}), **extra}


def produce(logs: RedisLogs, log: str, entries: list[dict[str, Any]]) -> list[str]:
    """Append the entries as a producer would (pipelined XADD); their ids."""
    ids: list[str] = []
    for start in range(0, len(entries), 1000):
        ids += logs.append_many(log, entries[start : start + 1000])
    return ids


def read_log(logs: RedisLogs | redis.Redis, log: str) -> list[dict[str, Any]]:
    """Every entry of a log, fields decoded (JSON fields parsed)."""
    client = logs.client if isinstance(logs, RedisLogs) else logs
    entries = []
    for _, fields in client.xrange(log):
        entry = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        for name in ("outputs", "error"):
            if name in entry:
                entry[name] = json.loads(entry[name])
        entries.append(entry)
    return entries


def wait_for_results(
    logs: RedisLogs | redis.Redis, log: str, count: int, timeout: float = 120
) -> list[dict[str, Any]]:
    client = logs.client if isinstance(logs, RedisLogs) else logs

    def enough() -> bool:
        return bool(client.xlen(log) >= count)

    wait_until(enough, lambda: f"{count} results in {log} (have {client.xlen(log)})", timeout)
    time.sleep(0.3)  # a result appended twice would show now
    return read_log(logs, log)


def direct_run(repo: ModelRepository, rows: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the same model file."""
    card = repo.resolve("digits")
    session = ort.InferenceSession(str(card.onnx_path), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(None, {"pixels": rows.astype(np.float32)})
    return {"label": label, "probabilities": probabilities}


def entry_records(database: Database, binding_id: str) -> list[Any]:
    """The binding's entry records with their jobs' status."""
    with database.engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT e.entry_id, e.request_id, e.job_id, e.published_at, j.status, j.tenant_id "
                "FROM stream_entries e JOIN jobs j ON j.id = e.job_id WHERE e.binding_id = :b"
            ),
            {"b": binding_id},
        ).all()
