"""A photo of a handwritten digit (PNG, JPEG, any format Pillow reads) as the
digits classifier's input: grey, 8x8, each pixel scaled to 0-16 as in the
scikit-learn digits it was trained on (white ink on black, as they are)."""

import io

import numpy as np
from PIL import Image

INPUTS = [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
OUTPUTS = [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]


def pixels(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data)).convert("L").resize((8, 8), Image.Resampling.BOX)
    return np.asarray(image, dtype=np.float32).reshape(64) / 255.0 * 16.0


def preprocess(batch):
    return [
        {"pixels": np.stack([pixels(image) for image in request["image"]])} for request in batch
    ]
