"""This service, started the way `make run` starts it: `python manage.py up`, with
its own fresh database and everything else at its defaults."""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from app.platform.settings import ROOT
from bench import procs
from bench.completion import PostgresJobs
from bench.contenders.base import Context, HttpContender, StreamDoor
from bench.infra import Database
from bench.load import Endpoint

READY_TIMEOUT_S = 180
INLINE = "digits-inline"  # (l): digits run in the API process


def classify(cmdline: list[str]) -> str | None:
    """The launcher's children, named by what they run (their children inherit)."""
    text = " ".join(cmdline)
    if "app.cli.api_server" in text or "granian" in text:
        return "api"
    if "app.grpc" in cmdline:
        return "grpc"
    if "app.streams" in text:
        return "streams"
    if "celery" not in text:
        return None
    if "flower" in cmdline:
        return "flower"
    if "beat" in cmdline:
        return "beat"
    if "worker" in cmdline:
        return "webhooks" if "webhooks" in text else "worker"
    return None


class Service(HttpContender):
    name = "service"
    runs_embedding_model = True
    serves_pipelines = True  # (p): the bundled pipelines
    soaks = True
    description = (
        "this service: manage.py up (granian API, the gRPC door, the stream consumer, Celery "
        "workers, beat, Flower)"
    )

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.proc: subprocess.Popen[bytes] | None = None
        self.database: Database | None = None
        self.env: dict[str, str] = {}

    def start(self) -> None:
        servers = self.ctx.servers
        self.database = servers.create_database(self.name, self.ctx.run_id)
        redis_db = servers.service_redis()
        if servers.embedded_redis:
            redis_db.client().flushdb()  # the bench's own Redis: nothing to keep
        port, flower_port, grpc_port = procs.free_port(), procs.free_port(), procs.free_port()
        var = ROOT / "var" / "bench" / "service"
        env = procs.child_env(
            DATABASE_URL=self.database.url,
            REDIS_URL=redis_db.base_url,
            VAR_DIR=str(var),
            GRPC_PORT=str(grpc_port),
            MODEL_REPOSITORY=str(with_inline_digits(self.ctx.model_repository, var / "models")),
        )
        self.env = env
        log = self.log_path("up")
        self.proc = procs.spawn(
            [sys.executable, "manage.py", "up", "--port", str(port),
             "--flower-port", str(flower_port)],
            env=env, cwd=ROOT, log_path=log,
        )  # fmt: skip
        procs.wait_http(port, "/v2/health/ready", self.proc, READY_TIMEOUT_S, log)
        api_key = procs.create_api_key(env, ROOT)
        auth = {"Authorization": f"Bearer {api_key}"}
        self.endpoint = Endpoint(port, "/jobs", "id", auth)
        self.sync_endpoint = Endpoint(port, "/v2/models/digits/infer", "id", auth)
        self.inline_endpoint = Endpoint(port, f"/v2/models/{INLINE}/infer", "id", auth)
        self.bulk_endpoint = Endpoint(port, "/jobs/bulk", "id", auth, many="jobs")
        self.batch_port = port
        from bench.grpc_load import GrpcEndpoint

        self.grpc_endpoint = GrpcEndpoint(f"127.0.0.1:{grpc_port}", api_key)
        self.stream = _bind(port, auth, redis_db.base_url)
        self.store = PostgresJobs(self.database)
        self.meter.trees = {self.proc.pid: "launcher", **self.ctx.shared_trees()}
        self.meter.classify = classify

    def add_model(self, path: Path, name: str) -> None:
        """`manage.py models add PATH --name NAME`, as an operator runs it while the
        service serves (for (o))."""
        subprocess.run([sys.executable, "manage.py", "models", "add", str(path), "--name", name],
                       env=self.env, cwd=ROOT, check=True, capture_output=True,
                       timeout=120)  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None:
            # Ctrl-C, as a person stops `make run`; the launcher stops its children.
            procs.stop(self.proc, signal.SIGINT, timeout=60)
        if self.database is not None:
            self.ctx.servers.drop_database(self.database)


def with_inline_digits(repository: Path, where: Path) -> Path:
    """A repository of the same models (linked, not copied) plus `digits-inline`:
    digits' file under a card that says `"execution": "inline"`, for (l)."""
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    for model in repository.iterdir():
        if model.is_dir():
            (where / model.name).symlink_to(model.resolve(), target_is_directory=True)
    version = where / INLINE / "1"
    version.mkdir(parents=True)
    digits = repository.resolve() / "digits" / "1"
    (version / "model.onnx").symlink_to(digits / "model.onnx")
    card = json.loads((digits / "card.json").read_text())
    (version / "card.json").write_text(json.dumps({**card, "execution": "inline"}, indent=2))
    return where


def _bind(port: int, auth: dict[str, str], redis_url: str) -> StreamDoor:
    """A stream binding of digits for (h): the service's consumer (a child of
    `manage.py up`) reads its input log."""
    body = json.dumps({"model": "digits", "input": "bench-requests", "output": "bench-results"})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/streams", body, {"Content-Type": "application/json", **auth})
        answer = conn.getresponse()
        binding = json.loads(answer.read())
    finally:
        conn.close()
    if answer.status != 201:
        raise RuntimeError(f"POST /streams answered {answer.status}: {binding}")
    return StreamDoor(redis_url, binding["input"], binding["output"])
