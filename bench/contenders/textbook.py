"""The textbook design (bench/peers/textbook), served like the service: gunicorn
2 workers x 16 threads, a Celery prefork worker of concurrency 2."""

from __future__ import annotations

import subprocess
import sys

from app.platform.settings import ROOT
from bench import procs
from bench.completion import PostgresJobs
from bench.contenders.base import Context, HttpContender
from bench.infra import Database
from bench.load import Endpoint
from bench.peers.textbook.db import create_schema

REDIS_DB = 15


def classify(cmdline: list[str]) -> str | None:
    text = " ".join(cmdline)
    return "api" if "gunicorn" in text else "worker" if "celery" in text else None


class Textbook(HttpContender):
    name = "textbook"
    description = "Flask + SQLAlchemy + one Celery task per job, commit per state"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.database: Database | None = None
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        servers = self.ctx.servers
        self.database = servers.create_database(self.name, self.ctx.run_id)
        redis_db = servers.redis_db(REDIS_DB)
        env = procs.child_env(
            TEXTBOOK_DATABASE_URL=self.database.psycopg2_url,
            TEXTBOOK_BROKER_URL=redis_db.broker_url,
            MODEL_REPOSITORY=str(self.ctx.model_repository),
        )
        create_schema(self.database.psycopg2_url)
        port = procs.free_port()
        api_log, worker_log = self.log_path("api"), self.log_path("worker")
        api = procs.spawn(
            [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "2",
             "--worker-class", "gthread", "--threads", "16", "--access-logfile", "-",
             "bench.peers.textbook.api:app"],
            env=env, cwd=ROOT, log_path=api_log,
        )  # fmt: skip
        worker = procs.spawn(
            [sys.executable, "-m", "celery", "-A", "bench.peers.textbook.tasks", "worker",
             "--concurrency", "2", "--queues", "bench-textbook", "--loglevel", "INFO"],
            env=env, cwd=ROOT, log_path=worker_log,
        )  # fmt: skip
        self.procs = [api, worker]
        procs.wait_http(port, "/health", api, 60, api_log)
        procs.wait_log(worker_log, "ready.", worker, 60)
        self.endpoint = Endpoint(port, "/jobs", "id")
        self.store = PostgresJobs(self.database)
        self.meter.trees = {api.pid: "api", worker.pid: "worker", **self.ctx.shared_trees()}
        self.meter.classify = classify

    def stop(self) -> None:
        for proc in self.procs:
            procs.stop(proc)
        if self.database is not None:
            self.ctx.servers.drop_database(self.database)
