"""Whether the CUDA provider starts here (imports nothing of the service, so the
engine's GPU tests run with ONNX Runtime and numpy alone)."""

from __future__ import annotations

from functools import cache

import onnxruntime as ort
from onnx import TensorProto, helper


@cache
def cuda_missing() -> str | None:
    """Why CUDA cannot be used here, None if it can: a one-node graph is asked for
    the CUDA provider, which onnxruntime-gpu lists even where it cannot start."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime has no CUDA provider (it has {ort.get_available_providers()})"
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ort.set_default_logger_severity(4)  # its "could not start" error is this answer
    try:
        session = ort.InferenceSession(
            model.SerializeToString(),
            providers=["CUDAExecutionProvider"],
        )
    finally:
        ort.set_default_logger_severity(2)
    used = session.get_providers()[0]
    return None if used == "CUDAExecutionProvider" else f"the CUDA provider did not start ({used})"
