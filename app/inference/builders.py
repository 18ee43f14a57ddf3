"""Models made offline from what installed packages ship (no download).

Each bundled model's definition is committed source: `models/<name>/<version>/
card.json` (inputs, outputs, labels, batching, and a `build` section naming the
builder below). Only the built `model.onnx` is left out of git; it carries its
build's provenance (package versions, time, measured metrics) in its ONNX
metadata. Workers check on load that the graph agrees with the card.

- `digits`: an MLP(256, 128) trained on scikit-learn's bundled 8x8 digits set,
  exported with skl2onnx.
- `heavy`: a compute-bound convolutional network over the same 8x8 inputs with
  fixed seeded weights (no training: it exists to make the model, not the
  plumbing, the cost of a job, about 20 ms of one core for 16 rows).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.config import ROOT

logger = logging.getLogger(__name__)

SEED = 0
BUNDLED = ROOT / "models"


def build_digits(card: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    import numpy as np
    import onnxruntime as ort
    import skl2onnx
    import sklearn
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    features, target = load_digits(return_X_y=True)
    features = features.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, target, test_size=0.25, random_state=SEED, stratify=target
    )
    clf = MLPClassifier(hidden_layer_sizes=(256, 128), max_iter=300, random_state=SEED)
    clf.fit(x_train, y_train)
    onx = to_onnx(
        clf,
        initial_types=[("pixels", FloatTensorType([None, 64]))],
        options={id(clf): {"zipmap": False}},
        target_opset=17,
    )
    session = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    accuracy = round(float((session.run(["label"], {"pixels": x_test})[0] == y_test).mean()), 4)
    expected = card.get("metrics", {}).get("heldout_accuracy")
    if expected is not None and accuracy != expected:
        logger.warning("digits: held-out accuracy %s, the card says %s", accuracy, expected)
    facts = {
        "heldout_accuracy": str(accuracy),
        "scikit-learn": sklearn.__version__,
        "skl2onnx": skl2onnx.__version__,
    }
    return _with_metadata(onx, facts), facts


def build_heavy(card: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
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
    return _with_metadata(model, facts), facts


Builder = Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]
BUILDERS: dict[str, Builder] = {"digits": build_digits, "heavy": build_heavy}


def ensure_models(root: Path, *, force: bool = False) -> list[Path]:
    """Build each bundled model whose `model.onnx` is missing from `root` (all of
    them with force); a repository other than the bundled one gets the card too."""
    built = []
    for card_path in sorted(BUNDLED.glob("*/*/card.json")):
        source = card_path.parent
        target = root / source.parent.name / source.name
        if (target / "model.onnx").is_file() and (target / "card.json").is_file() and not force:
            continue
        if target.resolve() != source.resolve():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(card_path, target / "card.json")
        card = json.loads(card_path.read_text())
        model_bytes, facts = BUILDERS[card["build"]["builder"]](card)
        _write_atomically(target / "model.onnx", model_bytes)
        logger.info("built %s/%s in %s (%s)", source.parent.name, source.name, target, facts)
        built.append(target)
    return built


def _with_metadata(model: Any, facts: dict[str, str]) -> bytes:
    """The built file records how it was built, beside the committed card."""
    import onnxruntime as ort

    stamp = {**facts, "onnxruntime": ort.__version__,
             "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    for key, value in stamp.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    data: bytes = model.SerializeToString()
    return data


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers (a running worker or API) never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; services may run as another user
    os.replace(tmp, path)
