"""On a GPU: onnxruntime-gpu's CUDA provider runs the bundled models as the CPU
does, and a worker with ORT_PROVIDER=cuda serves jobs and sync calls on it.

Marked `gpu` (`pytest -m gpu` runs only these). Where the CUDA provider does not
start (no GPU, no driver, onnxruntime without CUDA) every test here is skipped,
saying why: a CPU machine cannot tell whether they would pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flask import Flask

from app.cards import ModelCard
from app.platform.settings import ROOT, Settings
from app.repository.registry import ModelRepository
from app.runtime.engine import infer
from app.runtime.sessions import SessionPool
from app.runtime.tensors import parse_inputs
from modelbuild.bundled import ensure_models
from tests.conftest import TenantAuth, WorkerProcess, wait_for_job
from tests.gpu.probe import cuda_missing
from tests.inference.test_minilm import SENTENCES
from tests.support import starts_processes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_missing() is not None, reason=f"no usable GPU: {cuda_missing()}"),
]


@pytest.fixture(scope="module")
def bundled() -> ModelRepository:
    """digits, heavy and minilm, as `make run` serves them."""
    ensure_models(ROOT / "models")
    return ModelRepository(ROOT / "models")


@pytest.mark.parametrize("model", ["digits", "heavy", "minilm"])
def test_each_bundled_model_runs_on_cuda_as_on_the_cpu(
    bundled: ModelRepository, model: str
) -> None:
    card = bundled.resolve(model)
    requests = [parse_inputs(card, example(card, rows)) for rows in (1, 5, 16)]
    gpu, cpu = SessionPool("cuda"), SessionPool("cpu")
    on_gpu, on_cpu = infer(gpu, card, requests), infer(cpu, card, requests)
    assert gpu.providers() == {card.ref: "CUDAExecutionProvider"}
    for got, want in zip(on_gpu, on_cpu, strict=True):
        assert not isinstance(got, Exception) and not isinstance(want, Exception), (got, want)
        for name, array in want.items():
            assert got[name].shape == array.shape, name
            if array.dtype.kind == "f":
                np.testing.assert_allclose(got[name], array, rtol=1e-3, atol=1e-4)
            else:  # labels: the same digit (the probabilities above agree to 1e-3)
                assert np.array_equal(got[name], array), name


def example(card: ModelCard, rows: int) -> dict[str, object]:
    if card.name == "minilm":
        return {"text": (SENTENCES * rows)[:rows]}
    spec = card.inputs[0]
    shape = [rows, *(d if d > 0 else 8 for d in spec.shape[1:])]
    values = np.random.default_rng(rows).random(shape, dtype=np.float32) * 16
    return {spec.name: values.tolist()}


@pytest.fixture(scope="module")
@starts_processes
def cuda_worker(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    log = tmp_path_factory.mktemp("cuda-worker") / "worker.log"
    process = WorkerProcess(settings, log, ORT_PROVIDER="cuda", DRAIN_LINGER_MS="0")
    yield log
    process.stop()


def test_a_worker_on_cuda_serves_jobs_and_sync_calls(
    app: Flask, tenant: TenantAuth, cuda_worker: Path
) -> None:
    client = app.test_client()
    for model, inputs in (("minilm", {"text": SENTENCES}), ("digits", {"pixels": [[8.0] * 64]})):
        accepted = client.post("/jobs", json={"model": model, "inputs": inputs},
                               headers=tenant.headers)  # fmt: skip
        assert accepted.status_code == 202, accepted.json
        job = wait_for_job(client, tenant.headers, accepted.json["id"], timeout=120)
        assert job["status"] == "succeeded", job
    v2 = {"name": "text", "shape": [2], "datatype": "BYTES", "data": SENTENCES[:2]}
    answer = client.post("/v2/models/minilm/infer", json={"inputs": [v2]}, headers=tenant.headers)
    assert answer.status_code == 200, answer.json
    loaded = re.findall(r"loaded model (\S+) with (\w+)", cuda_worker.read_text())
    assert {"minilm:1", "digits:1"} <= {ref for ref, _ in loaded}
    assert {provider for _, provider in loaded} == {"CUDAExecutionProvider"}, loaded
