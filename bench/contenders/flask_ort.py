"""The bare Flask + ONNX Runtime sync endpoint (bench/peers/flask_ort.py), served
with the service API's gunicorn settings (2 workers, gthread, 32 threads), so the
two sync doors differ only in what runs inside a request."""

from __future__ import annotations

import subprocess

from app.cli.launcher import api_command
from app.platform.settings import ROOT
from bench import procs
from bench.contenders.base import Context, HttpContender
from bench.load import Endpoint


def gunicorn_command(bind: str) -> list[str]:
    """The service's own API command line with this app in place of the service's and
    without the service's gunicorn config (metrics directory, JSON logs): the same
    workers, worker class, threads and access log."""
    command = api_command(bind)
    config = command.index("--config")
    del command[config : config + 2]
    command[-1] = "bench.peers.flask_ort:app"
    return command


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
