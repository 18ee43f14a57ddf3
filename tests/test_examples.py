"""Every file under examples/ against one real `manage.py up` (what `make run` runs).

The stack starts once for the module, with loopback webhooks allowed and a model
repository of its own (the bundled models hard-linked, so `models add` in the
own-model example leaves models/ alone). Each example runs as a user runs it, in
an empty directory, with exactly the variables the banner's `export` lines set,
and its output is checked for the real answer, against the records the service
kept. A file added under examples/ that no check runs fails here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from app.platform.settings import ROOT
from modelbuild.bundled import ensure_models
from tests.support import wait_until
from tests.test_stack import Stack

pytestmark = [pytest.mark.stack, pytest.mark.processes]

EXAMPLES = ROOT / "examples"
TIMEOUT_S = 300  # generous: two cores shared by the whole stack and the example
Check = Callable[["Running", Path], None]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register the check that runs examples/<name>."""

    def register(function: Check) -> Check:
        CHECKS[name] = function
        return function

    return register


def example_files() -> list[str]:
    return sorted(p.name for p in EXAMPLES.iterdir() if p.is_file())


@dataclass
class Running:
    stack: Stack
    banner: str
    exports: dict[str, str]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.exports['INFERENCE_API_KEY']}"}

    def run(self, name: str, cwd: Path) -> str:
        """Run examples/<name> in `cwd` with the banner's variables; its stdout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_")}
        env.update(self.exports, PYTHONPATH=str(ROOT))  # inference_client, as if installed
        path = EXAMPLES / name
        command = ["bash", str(path)] if path.suffix == ".sh" else [sys.executable, str(path)]
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)  # fmt: skip
        assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stderr}{done.stdout}"
        return done.stdout

    def job(self, job_id: str) -> dict[str, Any]:
        """The job's record (a sync call's is written a moment after its answer)."""

        def found() -> dict[str, Any] | None:
            answer = requests.get(f"{self.stack.base}/jobs/{job_id}", headers=self.auth, timeout=10)
            return answer.json() if answer.status_code == 200 else None

        return wait_until(found, f"the record of job {job_id}", 30)


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    # Under the repository, not /tmp/pytest-*: the embedded PostgreSQL may run as
    # its own system user (see tests/test_stack.py).
    var_dir = ROOT / "var" / "test" / f"examples-{uuid.uuid4().hex[:8]}"
    var_dir.mkdir(parents=True)
    ensure_models(ROOT / "models")  # built once, where every other test finds them
    shutil.copytree(ROOT / "models", var_dir / "models", copy_function=os.link)
    stack = Stack(var_dir)
    stack.env.update(
        MODEL_REPOSITORY=str(var_dir / "models"),
        WEBHOOK_ALLOW_PRIVATE_NETWORKS="true",  # what the results tutorial tells users to set
    )
    try:
        banner = stack.start()
        exports = dict(re.findall(r"^  export (INFERENCE_\w+)=(\S+)$", banner, re.M))
        names = {"URL", "API_KEY", "WEBHOOK_SECRET", "GRPC_ADDRESS", "REDIS_URL"}
        assert set(exports) == {f"INFERENCE_{name}" for name in names}, banner
        assert exports["INFERENCE_URL"] == stack.base
        assert exports["INFERENCE_GRPC_ADDRESS"] == f"127.0.0.1:{stack.grpc_port}"
        yield Running(stack, banner, exports)
        assert stack.stop() == 0, stack.output[-3000:]
    finally:
        stack.kill()
        shutil.rmtree(var_dir, ignore_errors=True)


def test_every_example_has_a_check_and_every_check_an_example() -> None:
    assert set(CHECKS) == set(example_files()), (
        "a file under examples/ that no check below runs, or a check of a file that is gone"
    )


@pytest.mark.parametrize("name", example_files())
def test_example(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """examples/<name> runs against the stack and prints the real answer."""
    assert name in CHECKS, f"examples/{name} is run by no test: add a @check for it here"
    CHECKS[name](request.getfixturevalue("running"), tmp_path)


def _job_line(out: str) -> str:
    match = re.search(r"^job: (\S+)$", out, re.M)
    assert match, out
    return match.group(1)


@check("first_job.sh")
def _first_job_sh(running: Running, cwd: Path) -> None:
    out = running.run("first_job.sh", cwd)
    assert out.endswith("status: succeeded\ndigit: 0\n"), out
    job = running.job(_job_line(out))
    assert job["status"] == "succeeded" and job["outputs"]["label"] == [0]
    assert list(cwd.iterdir()) == []  # it leaves no file behind


@check("photo_job.sh")
def _photo_job_sh(running: Running, cwd: Path) -> None:
    out = running.run("photo_job.sh", cwd)
    assert re.search(r"status: succeeded\ndigit: 7 confidence: 0\.9\d*\n$", out), out
    job = running.job(_job_line(out))
    assert job["model"] == "digit-photo" and job["outputs"]["digit"] == [7]
    assert list(cwd.iterdir()) == []


@check("first_job.py")
def _first_job_py(running: Running, cwd: Path) -> None:
    out = running.run("first_job.py", cwd)
    assert out.endswith("status: succeeded\ndigit: 0\n"), out
    assert running.job(_job_line(out))["outputs"]["label"] == [0]


@check("events.py")
def _events(running: Running, cwd: Path) -> None:
    out = running.run("events.py", cwd)
    events = re.findall(r"^event (\d+): (\S+)$", out, re.M)
    ids, types = [int(i) for i, _ in events], [t for _, t in events]
    assert ids == sorted(set(ids)) and types[-1] == "job.succeeded", out  # in order, once each
    assert "job.running" in types, out
    assert out.endswith(f"event {ids[-1]}: job.succeeded\ndigit: 0\n"), out
    assert running.job(_job_line(out))["outputs"]["label"] == [0]


@check("webhook_receiver.py")
def _webhook(running: Running, cwd: Path) -> None:
    out = running.run("webhook_receiver.py", cwd)
    job_id = _job_line(out)
    assert f"event: job.succeeded {job_id}\ndigit: 0\n" in out, out

    def delivered() -> dict[str, Any] | None:  # recorded once the receiver has answered
        answer = requests.get(f"{running.stack.base}/jobs/{job_id}/deliveries",
                              headers=running.auth, timeout=10)  # fmt: skip
        (delivery,) = answer.json()["items"]
        return delivery if delivery["status"] == "delivered" else None

    delivery = wait_until(delivered, "the delivery's record", 30)
    assert delivery["event_type"] == "job.succeeded"
    assert delivery["url"].startswith("http://127.0.0.1:")
    assert delivery["log"][-1]["status_code"] == 204


@check("sync_http.py")
def _sync_http(running: Running, cwd: Path) -> None:
    out = running.run("sync_http.py", cwd)
    assert "digits: [0 1 2]\nprobabilities: (3, 10)\n" in out, out
    job = running.job(_job_line(out))
    assert job["status"] == "succeeded" and job["outputs"]["label"] == [0, 1, 2]


@check("grpc_example.py")
def _grpc(running: Running, cwd: Path) -> None:
    out = running.run("grpc_example.py", cwd)
    match = re.search(r"^digit: 0 job: (\S+)$", out, re.M)
    assert match, out
    assert running.job(match.group(1))["outputs"]["label"] == [0]
    assert out.endswith("stream: {'row-0': 0, 'row-1': 1, 'row-2': 2}\n"), out


@check("batch_parquet.py")
def _batch_parquet(running: Running, cwd: Path) -> None:
    out = running.run("batch_parquet.py", cwd)
    assert (cwd / "digits.parquet").stat().st_size > 0
    assert "shape: (300, 2)\ncolumns: ['label', 'probabilities']\n" in out, out
    assert "first labels: [0, 1, 2, 0, 1, 2]\n" in out, out
    assert out.endswith("labels counted: {0: 100, 1: 100, 2: 100}\n"), out
    match = re.search(r"^batch (\S+): succeeded, 300 rows$", out, re.M)
    assert match, out
    batch_id = match.group(1)
    batch = requests.get(f"{running.stack.base}/batches/{batch_id}", headers=running.auth,
                         timeout=10).json()  # fmt: skip
    assert batch["status"] == "succeeded" and batch["rows"] == batch["rows_done"] == 300, batch


@check("stream_example.py")
def _stream(running: Running, cwd: Path) -> None:
    for attempt in (1, 2):  # the second run finds the binding the first one made
        out = running.run("stream_example.py", cwd)
        results = re.findall(r"^\w+-(\d+) succeeded (\d) job: (\S+)$", out, re.M)
        assert sorted(int(i) for i, _, _ in results) == list(range(30)), (attempt, out)
        assert all(int(label) == int(i) % 3 for i, label, _ in results), out
        assert out.endswith("30 results read\n"), out
        _, label, job_id = results[0]
        assert running.job(job_id)["outputs"]["label"] == [int(label)]
    bindings = requests.get(f"{running.stack.base}/streams", headers=running.auth, timeout=10)
    assert len(bindings.json()["items"]) == 1


@check("chat_openai.py")
def _chat(running: Running, cwd: Path) -> None:
    out = running.run("chat_openai.py", cwd)
    text, summary = out.rstrip("\n").rsplit("\n", 1)
    match = re.fullmatch(r"(\d+) pieces, finish_reason: (stop|length), job: (\S+)", summary)
    assert match, out
    assert int(match.group(1)) > 1, out  # streamed piece by piece, not in one answer
    job = running.job(match.group(3))
    assert job["model"] == "smollm2" and job["outputs"]["text"] == text, (job, out)
    assert "4" in text, text  # greedy SmolLM2 knows what 2+2 is


@check("structured_documents.py")
def _structured(running: Running, cwd: Path) -> None:
    """Every ticket's row parses and matches the example's schema, its tone's
    probability is the largest of three; the embeddings and the background
    response came back."""
    out = running.run("structured_documents.py", cwd)
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == 6, out
    for line in lines[:4]:
        row, tone = line.rsplit(" tone=", 1)
        fields = json.loads(row)
        assert set(fields) == {"summary", "urgent", "product_area"}, line
        assert len(fields["summary"]) <= 80 and isinstance(fields["urgent"], bool), line
        assert fields["product_area"] in ("billing", "mobile app", "sales", "other"), line
        match = re.fullmatch(r"(positive|negative|neutral) \((0\.\d\d|1\.00)\)", tone)
        assert match and float(match.group(2)) > 1 / 3 - 0.01, line
    assert lines[4].startswith("4 embeddings of 384 dimensions"), out
    match = re.fullmatch(r"response (resp_[0-9a-f]{32}): (completed|incomplete), (\d+) characters",
                         lines[5])  # fmt: skip
    assert match and int(match.group(3)) > 0, out


@check("export_iris.py")
def _export_iris(running: Running, cwd: Path) -> None:
    out = running.run("export_iris.py", cwd)
    assert out == "wrote iris.onnx: input X outputs ['label', 'probabilities']\n", out
    added = subprocess.run(
        [sys.executable, "manage.py", "models", "add", str(cwd / "iris.onnx"), "--name", "iris"],
        cwd=ROOT, env=running.stack.env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr + added.stdout
    assert "added iris:1" in added.stdout and "input  X FP32 [-1, 4]" in added.stdout
    submitted = requests.post(
        f"{running.stack.base}/jobs", headers=running.auth, timeout=30,
        json={"model": "iris", "inputs": {"X": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}},
    )  # fmt: skip
    assert submitted.status_code == 202, submitted.text

    def finished() -> dict[str, Any] | None:
        job = running.job(submitted.json()["id"])
        return job if job["status"] not in ("queued", "running") else None

    job = wait_until(finished, "the iris job to finish", 60)
    assert job["status"] == "succeeded" and job["outputs"]["label"] == [0, 2], job
    assert not (ROOT / "models" / "iris").exists()  # added to the stack's repository only


def test_examples_say_what_they_show_install_and_read() -> None:
    """Each example opens with what it shows, what to install and the variables it
    reads, and reads no INFERENCE_* variable it does not name there."""
    for name in example_files():
        source = (EXAMPLES / name).read_text()
        if name.endswith(".py"):
            head = ast.get_docstring(ast.parse(source)) or ""
        else:
            head = "\n".join(re.findall(r"^# ?(.*)$", source.split("\nset ")[0], re.M))
        assert re.search(r"^(Install|Needs): ", head, re.M), name
        assert re.search(r"^Reads: ", head, re.M), name
        used = set(re.findall(r"INFERENCE_[A-Z_]+", source.replace(head, "")))
        assert used <= set(re.findall(r"INFERENCE_[A-Z_]+", head)), (name, used)
        assert "jq" not in re.findall(r"\b\w+\b", source), name  # curl and python3 only
