"""The BentoML contender: one `@bentoml.task` endpoint serving the same ONNX files.

This file runs under `bench/.venv-peers` (BentoML's dependencies would clash with
the service's pins), started by `bentoml serve service:InferenceTasks` from this
folder. The request body is the service's own, `{"model", "inputs": {"pixels"}}`,
so the load generator sends the same bytes to every contender.

BentoML runs a task in the worker process that accepted it, right after the
submit response, in its thread pool (one thread, like one ORT thread per worker
process elsewhere), and records it in a SQLite result store under BENTOML_HOME.
The bench reads that store to know when tasks finished.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
import onnxruntime as ort

MODEL_REPOSITORY = Path(os.environ["MODEL_REPOSITORY"])
WORKERS = int(os.environ.get("BENCH_BENTO_WORKERS", "2"))


def _latest_model_file(name: str) -> Path:
    versions = [d for d in (MODEL_REPOSITORY / name).iterdir() if (d / "model.onnx").is_file()]
    return max(versions, key=lambda d: int(d.name)) / "model.onnx"


@bentoml.service(workers=WORKERS, threads=1)
class InferenceTasks:
    """One ONNX Runtime session per model per worker process, one intra-op thread."""

    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.sessions: dict[str, ort.InferenceSession] = {}
        for model_dir in sorted(MODEL_REPOSITORY.iterdir()):
            if model_dir.is_dir() and any(model_dir.glob("*/model.onnx")):
                path = _latest_model_file(model_dir.name)
                self.sessions[model_dir.name] = ort.InferenceSession(
                    str(path), options, providers=["CPUExecutionProvider"]
                )

    @bentoml.task
    def infer(self, model: str, inputs: dict[str, list[list[float]]]) -> dict[str, Any]:
        session = self.sessions[model]
        feeds = {name: np.asarray(rows, dtype=np.float32) for name, rows in inputs.items()}
        names = [output.name for output in session.get_outputs()]
        outputs = session.run(names, feeds)
        return {name: value.tolist() for name, value in zip(names, outputs, strict=True)}
