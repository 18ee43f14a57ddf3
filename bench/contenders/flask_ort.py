"""The bare Flask + ONNX Runtime sync endpoint (bench/peers/flask_ort.py), under
gunicorn as the team that builds it by hand would serve it (2 workers, gthread,
32 threads a worker: the service API's processes and threads, access log on)."""

from __future__ import annotations

import subprocess
import sys

from app.platform.settings import ROOT
from bench import procs
from bench.contenders.base import Context, HttpContender
from bench.load import Endpoint


def gunicorn_command(bind: str) -> list[str]:
    """gunicorn serving the bare endpoint, as many processes and threads as the
    service's API has."""
    return [
        sys.executable, "-m", "gunicorn", "--bind", bind, "--workers", "2",
        "--worker-class", "gthread", "--threads", "32", "--graceful-timeout", "10",
        "--access-logfile", "-", "--no-control-socket", "bench.peers.flask_ort:app",
    ]  # fmt: skip


class FlaskOrt(HttpContender):
    name = "flask-ort"
    description = (
        "bare Flask + ONNX Runtime sync endpoint: KServe v2 JSON in and out, no key, no "
        "record, no queue; gunicorn as the service's API"
    )
    runs_heavy_model = False

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        port = procs.free_port()
        log = self.log_path("api")
        env = procs.child_env(MODEL_REPOSITORY=str(self.ctx.model_repository))
        self.proc = procs.spawn(
            gunicorn_command(f"127.0.0.1:{port}"), env=env, cwd=ROOT, log_path=log
        )
        procs.wait_http(port, "/v2/health/ready", self.proc, 60, log)
        self.sync_endpoint = Endpoint(port, "/v2/models/digits/infer", "id")
        self.meter.trees = {self.proc.pid: "api"}

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
