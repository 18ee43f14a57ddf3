"""(o) A model added while the service serves: the time from `manage.py models add`
returning to the first sync answer of the new model, on each sync door (KServe v2
over HTTP, gRPC ModelInfer), the median of ten models a door. Before the lane
served whatever the repository holds, such a call waited 30 s and failed until
the workers restarted."""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from app.grpc.generated import grpc_service_pb2 as pb
from bench.grpc_load import UNARY, GrpcEndpoint
from bench.stats import rounded

ADDS = 10  # models a door
GIVE_UP_S = 60.0


def identity_model(folder: Path) -> Path:
    """FP32 INPUT0 [-1, 4] -> OUTPUT0, as a user's own small model."""
    from onnx import TensorProto as T
    from onnx import helper as h

    graph = h.make_graph(
        [h.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [h.make_tensor_value_info("INPUT0", T.FLOAT, [None, 4])],
        [h.make_tensor_value_info("OUTPUT0", T.FLOAT, [None, 4])],
    )  # fmt: skip
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    path = folder / "identity.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _http_answered(port: int, headers: dict[str, str], model: str) -> float:
    """Seconds until the model's first sync call over HTTP answered 200."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GIVE_UP_S)
    started = time.perf_counter()
    while time.perf_counter() - started < GIVE_UP_S:
        conn.request("POST", f"/v2/models/{model}/infer", body,
                     {**headers, "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        response.read()
        if response.status == 200:
            return time.perf_counter() - started
        time.sleep(0.001)
    raise RuntimeError(f"{model} never answered over HTTP")


def _grpc_answered(endpoint: GrpcEndpoint, model: str) -> float:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), "<f4").tobytes())
    message = request.SerializeToString()
    with grpc.insecure_channel(endpoint.target) as channel:
        call = channel.unary_unary(UNARY)
        started = time.perf_counter()
        while time.perf_counter() - started < GIVE_UP_S:
            try:
                call(message, metadata=endpoint.metadata(), timeout=GIVE_UP_S)
                return time.perf_counter() - started
            except grpc.RpcError:
                time.sleep(0.001)
    raise RuntimeError(f"{model} never answered over gRPC")


def added_model(c: Any) -> dict[str, Any] | None:
    """(o), for a contender that can add a model while it serves (`add_model`)."""
    add = getattr(c, "add_model", None)
    if add is None or c.sync_endpoint is None or c.grpc_endpoint is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = identity_model(Path(folder))
        times: dict[str, list[float]] = {"http": [], "grpc": []}
        for i in range(ADDS * 2):
            door = "http" if i % 2 == 0 else "grpc"
            name = f"added-{uuid.uuid4().hex[:8]}"
            add(path, name)  # returns once the operator's command did
            if door == "http":
                times[door].append(_http_answered(c.sync_endpoint.port,
                                                  c.sync_endpoint.headers, name))  # fmt: skip
            else:
                times[door].append(_grpc_answered(c.grpc_endpoint, name))
    ms = {door: [t * 1000 for t in found] for door, found in times.items()}
    return {
        "workload": "o",
        "variant": f"{ADDS} models a door, each called once `models add` returned",
        "jobs": ADDS * 2,
        "http_first_answer_ms": rounded(statistics.median(ms["http"])),
        "grpc_first_answer_ms": rounded(statistics.median(ms["grpc"])),
        "http_first_answer_max_ms": rounded(max(ms["http"])),
        "grpc_first_answer_max_ms": rounded(max(ms["grpc"])),
    }
