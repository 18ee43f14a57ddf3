"""`digits`: an MLP(256, 128) trained on scikit-learn's bundled 8x8 digits set,
exported with skl2onnx; its held-out accuracy is measured with ONNX Runtime."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from modelbuild.files import SEED, with_metadata

logger = logging.getLogger(__name__)


def build_digits(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    import numpy as np
    import onnxruntime as ort
    import skl2onnx
    import sklearn
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    features, labels = load_digits(return_X_y=True)
    features = features.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=0.25, random_state=SEED, stratify=labels
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
    return with_metadata(onx, facts), facts
