"""digit-photo's three steps written as one model.py around the digits graph:
decoded with Pillow (grey, 8x8, 0-16), classified, answered. The benchmark runs
it beside the pipeline to price the pipeline's recording and scheduling."""

import io

import numpy as np
from PIL import Image

INPUTS = [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
OUTPUTS = [
    {"name": "digit", "datatype": "INT64", "shape": [-1]},
    {"name": "confidence", "datatype": "FP32", "shape": [-1]},
]


def pixels(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data)).convert("L").resize((8, 8), Image.Resampling.BOX)
    return np.asarray(image, dtype=np.float32).reshape(64) / 255.0 * 16.0


def preprocess(batch):
    return [
        {"pixels": np.stack([pixels(image) for image in request["image"]])} for request in batch
    ]


def postprocess(batch):
    return [
        {
            "digit": request["label"].astype(np.int64),
            "confidence": request["probabilities"].max(axis=1).astype(np.float32),
        }
        for request in batch
    ]
