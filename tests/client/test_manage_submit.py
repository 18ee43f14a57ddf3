"""`manage.py submit` end to end: a subprocess with the client, over HTTP."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import numpy as np
import pytest

from app.cards import ModelCard
from app.platform.settings import ROOT, Settings
from app.runtime.sessions import SessionPool
from inference_client import Client
from tests.conftest import service_env


def manage(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "submit", *args], cwd=ROOT, capture_output=True,
        text=True, timeout=120, env=service_env(settings, **env),
    )  # fmt: skip


@pytest.mark.usefixtures("worker")
def test_submit_wait_prints_the_finished_job(
    settings: Settings, base_url: str, api_key: str, model_repository: Path, tmp_path: Path
) -> None:
    x = (np.random.default_rng(5).random((2, 64)) * 16).astype(np.float32)
    np.save(tmp_path / "rows.npy", x)
    done = manage(settings, "--model", "digits", "--input", str(tmp_path / "rows.npy"), "--wait",
                  "--url", base_url, INFERENCE_API_KEY=api_key)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["status"] == "succeeded" and job["model"] == "digits"
    expected = SessionPool("cpu").run(
        ModelCard.load(model_repository / "digits" / "1"), {"pixels": x}
    )
    assert job["outputs"]["label"] == expected["label"].tolist()

    (tmp_path / "rows.json").write_text(json.dumps({"pixels": x[:1].tolist()}))
    queued = manage(settings, "--model", "digits", "--input", str(tmp_path / "rows.json"),
                    "--url", base_url, "--api-key", api_key)  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout)["status"] in ("queued", "running", "succeeded")


def test_submit_errors_print_the_problem_detail_and_fail(
    settings: Settings, base_url: str, api_key: str, tmp_path: Path
) -> None:
    np.save(tmp_path / "short.npy", np.zeros((1, 63), dtype=np.float32))
    refused = manage(settings, "--model", "digits", "--input", str(tmp_path / "short.npy"),
                     "--url", base_url, INFERENCE_API_KEY=api_key)  # fmt: skip
    assert refused.returncode == 1 and refused.stdout == ""
    assert "422 Inputs do not match the model" in refused.stderr
    assert "expected a FP32 tensor of shape [any, 64]" in refused.stderr

    np.save(tmp_path / "rows.npy", np.zeros((1, 64), dtype=np.float32))
    stranger = manage(settings, "--model", "digits", "--input", str(tmp_path / "rows.npy"),
                      "--url", base_url, "--api-key", "ik_not-a-key")  # fmt: skip
    assert stranger.returncode == 1 and "401" in stranger.stderr


@pytest.mark.usefixtures("worker")
def test_submit_each_row_prints_a_line_a_row(
    settings: Settings, base_url: str, api_key: str, model_repository: Path, tmp_path: Path
) -> None:
    x = (np.random.default_rng(6).random((3, 64)) * 16).astype(np.float32)
    np.save(tmp_path / "rows.npy", x)
    done = manage(settings, "--model", "digits", "--input", str(tmp_path / "rows.npy"),
                  "--each-row", "--wait", "--url", base_url, INFERENCE_API_KEY=api_key)  # fmt: skip
    assert done.returncode == 0, done.stderr
    jobs = [json.loads(line) for line in done.stdout.splitlines()]
    expected = SessionPool("cpu").run(
        ModelCard.load(model_repository / "digits" / "1"), {"pixels": x}
    )
    assert [job["status"] for job in jobs] == ["succeeded"] * 3
    assert [job["outputs"]["label"][0] for job in jobs] == expected["label"].tolist()
    assert len({job["id"] for job in jobs}) == 3

    (tmp_path / "mixed.json").write_text(json.dumps([[0.0] * 64, [0.0] * 63]))
    mixed = manage(settings, "--model", "digits", "--input", str(tmp_path / "mixed.json"),
                   "--each-row", "--url", base_url, INFERENCE_API_KEY=api_key)  # fmt: skip
    assert mixed.returncode == 1, mixed.stderr
    job, problem = (json.loads(line) for line in mixed.stdout.splitlines())
    assert job["status"] in ("queued", "running", "succeeded")
    assert problem["status"] == 422 and problem["index"] == 1 and "pixels" in problem["errors"]


ROWS = 1200  # two bulks of the service's 1,000
REFUSED = 1100  # in the second bulk: a value beyond FP32's range, refused at submit


def each_row_inputs(tmp_path: Path, model_repository: Path) -> tuple[Path, list[int]]:
    """rows.npy of ROWS digits rows (float64, as the service refuses one of them),
    and the labels the model gives the others, in order."""
    x = np.random.default_rng(7).random((ROWS, 64)) * 16
    x[REFUSED, 0] = 1e39  # finite JSON, but infinity as FP32: 422 invalid-input
    np.save(tmp_path / "rows.npy", x)
    kept = np.delete(x, REFUSED, axis=0).astype(np.float32)
    labels = SessionPool("cpu").run(
        ModelCard.load(model_repository / "digits" / "1"), {"pixels": kept}
    )["label"]
    return tmp_path / "rows.npy", labels.tolist()


def submit_each_row(
    settings: Settings, base_url: str, api_key: str, rows: Path, stderr: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "submit", "--model", "digits", "--input", str(rows),
         "--each-row", "--wait", "--url", base_url],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
        env=service_env(settings, INFERENCE_API_KEY=api_key),
    )  # fmt: skip


def check_each_row_lines(stdout: str, labels: list[int], api: Client) -> None:
    """A JSON line a row, in input order: each kept row's job, succeeded with its
    row's label (and so stored by the service), and the refused row's problem."""
    lines = stdout.splitlines()
    assert len(lines) == ROWS
    printed = [json.loads(line) for line in lines]  # every line JSON: no bar in stdout
    problem = printed.pop(REFUSED)
    assert problem["status"] == 422 and problem["type"].endswith("invalid-input"), problem
    assert problem["index"] == REFUSED  # its place in the input, not in its bulk
    assert "pixels" in problem["errors"], problem
    assert [job["status"] for job in printed] == ["succeeded"] * (ROWS - 1)
    assert [job["outputs"]["label"][0] for job in printed] == labels
    assert len({job["id"] for job in printed}) == ROWS - 1
    stored = [api.jobs.get(job["id"]) for job in printed]
    assert [job.id for job in stored] == [job["id"] for job in printed]
    assert all(job.status == "succeeded" and job.model == "digits" for job in stored)


@pytest.mark.usefixtures("worker")
def test_submit_each_row_draws_no_bar_when_stderr_is_a_pipe(
    settings: Settings, base_url: str, api_key: str, api: Client,
    model_repository: Path, tmp_path: Path,
) -> None:  # fmt: skip
    rows, labels = each_row_inputs(tmp_path, model_repository)
    proc = submit_each_row(settings, base_url, api_key, rows, subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr  # one row refused
    check_each_row_lines(stdout, labels, api)
    assert "%|" not in stderr and "submit:" not in stderr and "wait:" not in stderr, stderr


@pytest.mark.usefixtures("worker")
def test_submit_each_row_draws_its_bars_on_a_terminal_stderr_only(
    settings: Settings, base_url: str, api_key: str, api: Client,
    model_repository: Path, tmp_path: Path,
) -> None:  # fmt: skip
    rows, labels = each_row_inputs(tmp_path, model_repository)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    received = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every end of the terminal's slave side closed
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        proc = submit_each_row(settings, base_url, api_key, rows, slave)
    finally:
        os.close(slave)
    try:
        stdout, _ = proc.communicate(timeout=300)
        reader.join(30)
    finally:
        os.close(master)
    terminal = received.decode(errors="replace")
    assert proc.returncode == 1, terminal[-3000:]  # one row refused
    check_each_row_lines(stdout, labels, api)
    assert "submit: 100%|" in terminal and f"{ROWS}/{ROWS}" in terminal, terminal[-3000:]
    assert "wait: 100%|" in terminal, terminal[-3000:]
    assert '"status"' not in terminal  # the lines went to stdout alone
