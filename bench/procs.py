"""Starting and stopping a contender's processes, with their output in a log file."""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def spawn(
    args: list[str], *, env: dict[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """Start `args` in its own session (Ctrl-C on the bench reaches only the bench),
    its output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    logger.info("started %s (pid %s), log %s", " ".join(args[:4]), proc.pid, log_path)
    return proc


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Ask `proc` to stop with `sig`; after `timeout`, kill it and every process it
    left behind (the descendants are listed before asking, so orphans are found)."""
    if proc.poll() is not None:
        return
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("pid %s did not stop in %ss; killing it and its children", proc.pid, timeout)
        proc.kill()
        proc.wait()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def wait_http(
    port: int, path: str, proc: subprocess.Popen[bytes], timeout: float, log_path: Path
) -> None:
    """Wait until GET `path` answers 200, or fail with the log's last lines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before ready: {tail(log_path)}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise RuntimeError(f"GET {path} not 200 within {timeout:.0f}s: {tail(log_path)}")


def tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def child_env(**overrides: str) -> dict[str, str]:
    """This environment with `overrides`, and unbuffered Python output for the logs."""
    env = dict(os.environ)
    env.update(overrides)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_log(log_path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until `text` appears in the log (a Celery worker's "ready.")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before ready: {tail(log_path)}")
        with contextlib.suppress(OSError):
            if text in log_path.read_text(errors="replace"):
                return
        time.sleep(0.2)
    raise RuntimeError(f"no {text!r} in {log_path} within {timeout:.0f}s: {tail(log_path)}")


def create_api_key(env: dict[str, str], cwd: Path, tenant: str = "bench") -> str:
    """A new API key of `tenant` on the service `env` names (manage.py create-api-key)."""
    import json
    import sys

    made = subprocess.run(
        [sys.executable, "manage.py", "create-api-key", "--tenant", tenant, "--json"],
        env=env, cwd=cwd, capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    key: str = json.loads(made.stdout.decode().strip().splitlines()[-1])["api_key"]
    return key
