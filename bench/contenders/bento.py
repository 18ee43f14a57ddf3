"""BentoML tasks (bench/peers/bento/service.py), served by `bentoml serve` from
its own virtual environment, `bench/.venv-peers`, made here on first use from
`bench/requirements-peers.txt`.

Completion is read from BentoML's own task result store, the SQLite file its
workers write each task's status and `completed_at` to, every 0.5 s: the same
"read the peer's job table" rule as for PostgreSQL, and it costs BentoML nothing.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from app.platform.settings import ROOT
from bench import procs
from bench.completion import BentoResults
from bench.contenders.base import Context, HttpContender
from bench.load import Endpoint

logger = logging.getLogger(__name__)

BENCH = ROOT / "bench"
VENV = BENCH / ".venv-peers"
REQUIREMENTS = BENCH / "requirements-peers.txt"
STAMP = VENV / ".installed"
SERVICE_DIR = BENCH / "peers" / "bento"


class Unavailable(RuntimeError):
    """The contender cannot run here; the message says why."""


def ensure_venv() -> Path:
    """bench/.venv-peers with requirements-peers.txt installed; its bentoml."""
    bentoml = VENV / "bin" / "bentoml"
    if STAMP.is_file() and STAMP.stat().st_mtime >= REQUIREMENTS.stat().st_mtime:
        return bentoml
    logger.info("creating %s from %s (once; a minute or two)", VENV, REQUIREMENTS.name)
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [
        [base, "-m", "venv", "--clear", str(VENV)],
        [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines() if "is ignored" not in ln]
            raise Unavailable(f"{' '.join(step[:4])} failed: {' | '.join(lines[-3:])}")
    STAMP.touch()
    return bentoml


class Bento(HttpContender):
    name = "bentoml"
    description = "BentoML 1.4 @bentoml.task, 2 workers x 1 thread, submit then store"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        bentoml = ensure_venv()
        home = ROOT / "var" / "bench" / "bentoml-home"
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        port = procs.free_port()
        env = procs.child_env(
            BENTOML_HOME=str(home),
            BENTOML_DO_NOT_TRACK="True",
            MODEL_REPOSITORY=str(self.ctx.model_repository),
        )
        env.pop("VIRTUAL_ENV", None)
        log = self.log_path("serve")
        self.proc = procs.spawn(
            [str(bentoml), "serve", "service:InferenceTasks", "--host", "127.0.0.1",
             "--port", str(port)],
            env=env, cwd=SERVICE_DIR, log_path=log,
        )  # fmt: skip
        try:
            procs.wait_http(port, "/readyz", self.proc, 120, log)
        except RuntimeError as exc:
            raise Unavailable(f"bentoml serve did not become ready: {exc}") from exc
        self.endpoint = Endpoint(port, "/infer/submit", "task_id")
        store = home / "task_result.db"
        deadline = time.monotonic() + 30
        while not store.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.store = BentoResults(str(store))
        self.meter.trees = {self.proc.pid: "bentoml", **self.ctx.shared_trees(False)}

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, timeout=30)
