"""The bare Celery round trip (bench/peers/celery_noop.py): the bench publishes N
no-op tasks and times until the queue is empty and nothing is unacknowledged.

With acks_late, kombu's Redis transport keeps a message it handed to a worker in
the `unacked` hash until the task returns, so "queue list empty and `unacked`
empty" means every task ran. There is no job table, so this one contender is
polled in Redis, every 20 ms (two reads in one round trip), which the figure's
resolution is; it needs no help from the workers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from app.platform.settings import ROOT
from bench import procs
from bench.contenders.base import Context
from bench.cpu import RoleMeter, per_job_ms
from bench.infra import RedisDb

REDIS_DB = 14
POLL_S = 0.02
UNACKED_KEY = "unacked"  # kombu.transport.redis.Channel.unacked_key


class CeleryNoop:
    name = "celery-noop"
    description = "bare Celery round trip: prefork 2, acks_late, prefetch 1, no-op task"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.proc: subprocess.Popen[bytes] | None = None
        self.redis_db: RedisDb | None = None

    def __enter__(self) -> CeleryNoop:
        self.redis_db = self.ctx.servers.redis_db(REDIS_DB)
        env = procs.child_env(BENCH_NOOP_BROKER_URL=self.redis_db.broker_url)
        log = self.ctx.log_dir / f"{self.name}-worker.log"
        self.proc = procs.spawn(
            [sys.executable, "-m", "celery", "-A", "bench.peers.celery_noop", "worker",
             "--concurrency", "2", "--queues", "bench-noop", "--loglevel", "WARNING"],
            env=env, cwd=ROOT, log_path=log,
        )  # fmt: skip
        self.run(20, timeout=60)  # warm-up: returns once the worker consumes
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            procs.stop(self.proc)

    def run(self, tasks: int, timeout: float = 120) -> dict[str, Any]:
        """Publish `tasks` no-ops from this process and time the round trip."""
        from bench.peers.celery_noop import QUEUE, app, noop

        assert self.proc is not None and self.redis_db is not None
        app.conf.broker_url = self.redis_db.broker_url
        client = self.redis_db.client()
        meter = RoleMeter(trees={self.proc.pid: "worker", **self.ctx.shared_trees(False)})
        with app.connection_for_write() as conn:
            conn.ensure_connection()
            before = meter.sample()
            start = time.time()
            cpu = time.process_time()
            with app.producer_or_acquire() as producer:
                for _ in range(tasks):
                    noop.apply_async(producer=producer)
            publish_cpu = time.process_time() - cpu
            published = time.time()
        done = _wait_empty(client, QUEUE, timeout)
        after = meter.sample()
        span = done - start
        return {
            "tasks": tasks,
            "tasks_per_s": round(tasks / span, 1),
            "publish_s": round(published - start, 3),
            "client_cpu_ms_per_request": round(1000 * publish_cpu / tasks, 3),
            "cpu_ms_per_job": per_job_ms(before, after, tasks),
        }


def _wait_empty(client: Any, queue: str, timeout: float) -> float:
    """Time the queue and the unacked hash were first seen empty, confirmed by the
    next poll too (a message in flight between the two keys is not "done")."""
    deadline = time.monotonic() + timeout
    first_empty: float | None = None
    while time.monotonic() < deadline:
        pipe = client.pipeline(transaction=False)
        pipe.llen(queue)
        pipe.hlen(UNACKED_KEY)
        queued, unacked = pipe.execute()
        now = time.time()
        if queued == 0 and unacked == 0:
            if first_empty is not None:
                return first_empty
            first_empty = now
        else:
            first_empty = None
        time.sleep(POLL_S)
    raise TimeoutError(f"Celery no-op queue not empty after {timeout:.0f}s")
