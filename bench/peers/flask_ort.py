"""The bare sync endpoint: Flask + ONNX Runtime, nothing else.

`POST /v2/models/<model>/infer` takes the KServe v2 JSON body the service's sync
door takes and answers the v2 JSON, with no key, no job row and no queue: the
fastest a Python sync endpoint on this stack can be, so the service's sync door
is measured against it. Served by gunicorn like the service's API (2 workers,
gthread, 32 threads); one session per model per worker process, made after the
fork on first use, one intra-op thread (the service's ORT_INTRA_OP_THREADS default).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from flask import Flask, abort, request
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

MODELS = Path(os.environ.get("MODEL_REPOSITORY", "models"))
V2_TO_NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}
NUMPY_TO_V2 = {np.dtype(t).name: name for name, t in V2_TO_NUMPY.items()}

app = Flask(__name__)
_sessions: dict[str, tuple[ort.InferenceSession, str]] = {}
_lock = threading.Lock()


def session(model: str) -> tuple[ort.InferenceSession, str]:
    """The newest version's session and its version number; 404 for an unknown model."""
    if (found := _sessions.get(model)) is not None:
        return found
    with _lock:  # made once per process, by the first request that needs it
        if model not in _sessions:
            versions = [p for p in (MODELS / model).glob("*/model.onnx") if p.parent.name.isdigit()]
            if not versions:
                abort(404)
            newest = max(versions, key=lambda p: int(p.parent.name))
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            made = ort.InferenceSession(str(newest), options, providers=["CPUExecutionProvider"])
            _sessions[model] = (made, newest.parent.name)
        return _sessions[model]


def decode(body: dict[str, Any]) -> dict[str, np.ndarray]:
    """The v2 `inputs` as arrays; 400 for anything else."""
    if not isinstance(body.get("inputs"), list):
        abort(400)
    feeds = {}
    for tensor in body["inputs"]:
        try:
            dtype = V2_TO_NUMPY[tensor["datatype"]]
            feeds[tensor["name"]] = np.asarray(tensor["data"], dtype=dtype).reshape(tensor["shape"])
        except (KeyError, TypeError, ValueError):
            abort(400)
    return feeds


@app.post("/v2/models/<model>/infer")
def infer(model: str) -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        abort(400)
    runner, version = session(model)
    feeds = decode(body)
    names = [output.name for output in runner.get_outputs()]
    try:
        arrays = runner.run(names, feeds)
    except (Fail, InvalidArgument):  # inputs that do not fit the model
        abort(400)
    answer: dict[str, Any] = {
        "model_name": model,
        "model_version": version,
        "outputs": [
            {
                "name": name,
                "datatype": NUMPY_TO_V2[array.dtype.name],
                "shape": list(array.shape),
                "data": array.reshape(-1).tolist(),
            }
            for name, array in zip(names, arrays, strict=True)
        ],
    }
    if "id" in body:
        answer["id"] = body["id"]
    return answer


@app.get("/v2/health/ready")
def ready() -> dict[str, bool]:
    return {"ready": True}
