"""Models made offline from what installed packages ship (no download).

`digits`: an MLP(256, 128) trained on scikit-learn's bundled 8x8 digits set,
exported with skl2onnx. The card is written from the exported graph itself, so
it cannot disagree with the model, and records the held-out accuracy.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.inference.datatypes import ORT_TO_V2

logger = logging.getLogger(__name__)

SEED = 0


def build_digits(root: Path) -> Path:
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
    model_bytes = onx.SerializeToString()
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    labels = session.run(["label"], {"pixels": x_test})[0]
    accuracy = float((labels == y_test).mean())

    card: dict[str, Any] = {
        "description": "Handwritten digit classifier: 8x8 grey images, pixel values 0-16, "
        "one row of 64 values per image. Outputs the digit and the 10 class probabilities.",
        "platform": "onnxruntime_onnx",
        "inputs": _specs(session.get_inputs()),
        "outputs": _specs(session.get_outputs()),
        "labels": [str(d) for d in range(10)],
        # Rows are independent and a call of 64 costs little more than one (ORT's
        # GEMM); 2 ms is the longest a lone job waits for company.
        "batching": {"max_batch_size": 64, "max_queue_delay_ms": 2},
        "metrics": {"heldout_accuracy": round(accuracy, 4), "heldout_rows": len(y_test)},
        "made_by": {
            "command": "python manage.py models build",
            "data": "sklearn.datasets.load_digits (ships with scikit-learn)",
            "estimator": "MLPClassifier(hidden_layer_sizes=(256, 128), max_iter=300, "
            f"random_state={SEED}), 75/25 stratified split, random_state={SEED}",
            "versions": {
                "scikit-learn": sklearn.__version__,
                "skl2onnx": skl2onnx.__version__,
                "onnxruntime": ort.__version__,
            },
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    target_dir = root / "digits" / "1"
    _write_atomically(target_dir / "model.onnx", model_bytes)
    _write_atomically(target_dir / "card.json", (json.dumps(card, indent=2) + "\n").encode())
    logger.info("built digits model in %s (held-out accuracy %.4f)", target_dir, accuracy)
    return target_dir


BUILDERS: dict[str, Callable[[Path], Path]] = {"digits": build_digits}


def ensure_models(root: Path, *, force: bool = False) -> list[Path]:
    """Build each bundled model whose files are missing (all of them with force)."""
    built = []
    for name, builder in BUILDERS.items():
        present = any(
            (d / "model.onnx").is_file() and (d / "card.json").is_file()
            for d in (root / name).glob("*")
        )
        if force or not present:
            built.append(builder(root))
    return built


def _specs(nodes: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": n.name,
            "datatype": ORT_TO_V2[n.type],
            "shape": [d if isinstance(d, int) else -1 for d in n.shape],
        }
        for n in nodes
    ]


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers (a running worker or API) never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; services may run as another user
    os.replace(tmp, path)
