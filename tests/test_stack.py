"""`manage.py up` (what `make run` runs) end to end, on the embedded default.

Starts the whole service with no DATABASE_URL / REDIS_URL, pastes its banner's
`export` lines and curl into bash, runs the first-job example with them, creates
a key from the CLI while it runs, stops it with Ctrl-C (SIGINT), starts it again
and finds every job. tests/test_examples.py runs every other example.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton

from app.platform import embedded
from app.platform.settings import ROOT
from inference_client import Client
from tests.models import user_model
from tests.support import free_port, wait_until

EXAMPLES = ROOT / "examples"
pytestmark = [pytest.mark.stack, pytest.mark.processes]


class Stack:
    def __init__(self, var_dir: Path) -> None:
        self.var_dir = var_dir
        self.port, self.flower_port, self.grpc_port = free_port(), free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "REDIS_URL", "JOBS_QUEUE")
        }
        self.env.update(
            VAR_DIR=str(var_dir),
            PORT=str(self.port),
            FLOWER_PORT=str(self.flower_port),
            GRPC_PORT=str(self.grpc_port),
            PYTHONUNBUFFERED="1",
        )
        self.proc: subprocess.Popen[str] | None = None
        self.output = ""

    def start(self) -> str:
        """Start and return what it printed up to its ready banner."""
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "up"],
            cwd=ROOT,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120
        for line in self.proc.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C to stop."):
                break
            assert time.monotonic() < deadline, "".join(lines[-50:])
        else:
            raise AssertionError("manage.py up exited:\n" + "".join(lines[-80:]))
        return "".join(lines)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        rest, _ = self.proc.communicate(timeout=90)
        self.output += rest
        return self.proc.returncode

    def kill(self) -> None:
        """After a failed test: stop the launcher and its children (each in a session
        of its own, so they outlive a launcher that is only killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        children = children_of(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)  # the launcher stops its children
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def var_dir() -> Iterator[Path]:
    # Under the repository, not /tmp/pytest-*: those are mode 0700, and the embedded
    # PostgreSQL runs as its own system user when the tests run as root.
    path = ROOT / "var" / "test" / f"stack-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def walkthrough_pixels() -> list[list[float]]:
    """The image the first-job example submits, read from its curl command."""
    match = re.search(r'"pixels": (\[\[[0-9,]+\]\])', (EXAMPLES / "first_job.sh").read_text())
    assert match, "examples/first_job.sh submits no pixels"
    pixels: list[list[float]] = json.loads(match.group(1))
    return pixels


def exports(banner: str) -> dict[str, str]:
    """The variables the banner's ready-to-paste `export` lines set."""
    return dict(re.findall(r"^  export (INFERENCE_\w+)=(\S+)$", banner, re.M))


def pasted(banner: str, *lines: str) -> subprocess.CompletedProcess[str]:
    """The banner's `export` lines and then `lines`, run by bash as a user pastes them."""
    script = "\n".join([*re.findall(r"^  (export INFERENCE_\w+=\S+)$", banner, re.M), *lines])
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_")}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_make_run_walkthrough_restart_and_cli(var_dir: Path) -> None:
    stack = Stack(var_dir)
    try:
        banner = stack.start()
        env = exports(banner)
        api_key, secret = env["INFERENCE_API_KEY"], env["INFERENCE_WEBHOOK_SECRET"]
        assert api_key.startswith("ik_") and secret.startswith("whsec_"), banner[-3000:]
        assert "(tenant 'default', shown once)" in banner and banner.count("whsec_") == 1
        assert env["INFERENCE_URL"] == stack.base
        assert f"gRPC (KServe v2, tritonclient.grpc): 127.0.0.1:{stack.grpc_port}" in banner
        assert env["INFERENCE_GRPC_ADDRESS"] == f"127.0.0.1:{stack.grpc_port}"
        assert env["INFERENCE_REDIS_URL"] == embedded.redis_url(var_dir)  # the stream door's
        flower, flower_login = _flower(banner)
        assert requests.get(f"{flower}/api/workers", timeout=10).status_code == 401
        assert requests.get(f"{flower}/api/workers", auth=flower_login, timeout=10).ok
        page = requests.get(f"{stack.base}/", timeout=10)
        assert page.status_code == 200 and f'href="{flower}"' in page.text
        assert stack.proc is not None
        assert len(children_of(stack.proc.pid)) >= 5  # redis, api, worker, beat, flower

        # The banner's "Try it" curl, pasted after its export lines: a queued job.
        try_it = [line.strip() for line in banner.splitlines()
                  if line.startswith('  curl -s -X POST "$INFERENCE_URL/jobs"')]  # fmt: skip
        assert len(try_it) == 1, banner
        tried = pasted(banner, try_it[0])
        assert tried.returncode == 0, tried.stderr
        assert json.loads(tried.stdout)["status"] == "queued", tried.stdout

        # The walk-through, examples/first_job.sh, with the variables the banner set.
        run = pasted(banner, f"bash {EXAMPLES / 'first_job.sh'}")
        assert run.returncode == 0, run.stderr + run.stdout
        assert run.stdout.endswith("status: succeeded\ndigit: 0\n"), run.stdout
        job_id = re.search(r"^job: (\S+)$", run.stdout, re.M).group(1)  # type: ignore[union-attr]
        owner = {"Authorization": f"Bearer {api_key}"}
        job = requests.get(f"{stack.base}/jobs/{job_id}", headers=owner, timeout=10).json()
        assert job["status"] == "succeeded" and job["outputs"]["label"] == [0]

        # create-api-key against the embedded database of the running service.
        cli = subprocess.run(
            [sys.executable, "manage.py", "create-api-key", "--tenant", "acme", "--json"],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        creds = json.loads(cli.stdout)
        assert set(creds) == {"tenant", "api_key", "webhook_secret"}
        assert creds["tenant"] == "acme" and creds["webhook_secret"].startswith("whsec_")
        acme = {"Authorization": f"Bearer {creds['api_key']}"}
        assert requests.get(f"{stack.base}/jobs", headers=acme, timeout=10).json()["items"] == []
        # The Python client against the running service: the same job, followed by SSE.
        with Client(stack.base, creds["api_key"]) as client:
            mine = client.jobs.submit("digits", {"pixels": walkthrough_pixels()})
            done = client.jobs.wait(mine.id, timeout=60, via="sse")
            assert done.status == "succeeded" and done.outputs == job["outputs"], done
            assert [j.id for j in client.jobs.list()] == [mine.id]
        assert (
            requests.get(f"{stack.base}/jobs/{job['id']}", headers=acme, timeout=10).status_code
            == 404
        )

        launcher_pid = stack.proc.pid
        children = children_of(launcher_pid)
        assert stack.stop() == 0, stack.output[-3000:]

        def left() -> list[int]:
            return [pid for pid in children if Path(f"/proc/{pid}").exists()]

        wait_until(lambda: not left(), lambda: f"the launcher's children to exit: {left()}", 10)
        assert left() == [], stack.output

        # Start again: nothing lost, no second key printed, the old keys still work.
        banner = stack.start()
        assert "create-api-key" in banner and "whsec_" not in banner
        unsecret = {k: v for k, v in env.items() if k.endswith(("_URL", "_ADDRESS"))}
        assert exports(banner) == unsecret  # all but the key and the secret, printed once
        assert _flower(banner) == (flower, flower_login)  # the same login after a restart
        again = requests.get(f"{stack.base}/jobs/{job['id']}", headers=owner, timeout=10).json()
        assert again == job
        assert stack.stop() == 0
    finally:
        stack.kill()


def _flower(banner: str) -> tuple[str, tuple[str, str]]:
    """Flower's URL and the login `make run` made for it, as its banner prints them."""
    match = re.search(r"Flower (http://\S+)  \(user (\S+), password (\S+), kept in", banner)
    assert match, banner[-3000:]
    return match.group(1), (match.group(2), match.group(3))


def _key(stack: Stack, tenant: str) -> dict[str, str]:
    cli = subprocess.run(
        [sys.executable, "manage.py", "create-api-key", "--tenant", tenant, "--json"],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return {"Authorization": f"Bearer {json.loads(cli.stdout)['api_key']}"}


def test_one_tenant_holding_streams_leaves_the_others_served(var_dir: Path) -> None:
    """Under the real API server (2 processes x 32 threads): a tenant opening many
    event streams is refused beyond its share (429) and, however many it opens,
    another tenant's submit and the readiness check answer within seconds."""
    stack = Stack(var_dir)
    streams: list[requests.Response] = []
    try:
        stack.start()
        greedy, polite = _key(stack, "greedy"), _key(stack, "polite")
        rows = [[8.0] * 64] * 8192  # a heavy job of about ten seconds: its stream stays open
        job = requests.post(f"{stack.base}/jobs", headers=greedy, timeout=30,
                            json={"model": "heavy", "inputs": {"pixels": rows}}).json()  # fmt: skip
        statuses = []
        for _ in range(70):  # more than the 64 threads of both processes
            response = requests.get(f"{stack.base}/jobs/{job['id']}/events", headers=greedy,
                                    stream=True, timeout=30)  # fmt: skip
            statuses.append(response.status_code)
            if response.status_code == 200:
                streams.append(response)  # kept open: each holds a thread
            else:
                assert response.headers["Content-Type"] == "application/problem+json"
                assert response.headers["Retry-After"]
        assert statuses.count(200) <= 24 and statuses.count(429) >= 46, statuses
        started = time.monotonic()
        one = {"model": "digits", "inputs": {"pixels": [[1.0] * 64]}}
        submitted = requests.post(f"{stack.base}/jobs", headers=polite, json=one, timeout=5)
        assert submitted.status_code == 202
        assert requests.get(f"{stack.base}/v2/health/ready", timeout=5).status_code == 200
        assert time.monotonic() - started < 5
    finally:
        for response in streams:
            response.close()
        if stack.proc is not None and stack.proc.poll() is None:
            stack.stop()
        stack.kill()


def test_a_fresh_start_logs_no_error_and_answers_a_model_added_while_it_runs(
    var_dir: Path, tmp_path: Path
) -> None:
    """A fresh clone's first `make run` reads no table before the migrations made it
    (nothing logged as an error), and a model `models add`ed while it runs answers
    a sync call over HTTP and over gRPC at once, with no restart."""
    stack = Stack(var_dir)
    # A repository of its own (the bundled models linked), so the model it adds is
    # not left in the checkout's.
    repository = var_dir / "models"
    for bundled in (ROOT / "models").iterdir():
        if bundled.is_dir():
            (repository / bundled.name).mkdir(parents=True)
            for version in bundled.iterdir():
                (repository / bundled.name / version.name).symlink_to(version.resolve())
    stack.env["MODEL_REPOSITORY"] = str(repository)
    try:
        banner = stack.start()
        for bad in ("does not exist", "Traceback", " ERROR ", '"level": "ERROR"'):
            assert bad not in banner, banner[-4000:]
        key = exports(banner)["INFERENCE_API_KEY"]
        added = subprocess.run(
            [sys.executable, "manage.py", "models", "add", str(user_model("identity", tmp_path)),
             "--name", "mine"],
            cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert added.returncode == 0, added.stdout + added.stderr
        returned = time.monotonic()
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                            "data": [1.0, 2.0, 3.0, 4.0]}]}  # fmt: skip
        http = requests.post(f"{stack.base}/v2/models/mine/infer", json=body, timeout=60,
                             headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        http_s = time.monotonic() - returned
        assert http.status_code == 200, http.text
        assert http.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
        client = triton.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
        tensor = triton.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
        answer = client.infer("mine", [tensor], headers={"authorization": f"Bearer {key}"})
        grpc_s = time.monotonic() - returned
        assert answer.as_numpy("OUTPUT0").tolist() == [[1.0, 2.0, 3.0, 4.0]]
        print(json.dumps({"http_answer_s": round(http_s, 3), "grpc_answer_s": round(grpc_s, 3)}))
        assert stack.stop() == 0
    finally:
        stack.kill()
