"""`manage.py submit` end to end: a subprocess with the client, over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.cards import ModelCard
from app.platform.settings import ROOT, Settings
from app.runtime.sessions import SessionPool
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
