"""Folders of models with their own code (model.py), as an operator brings them:
the photo classifier written as one model.py around the digits graph, and a
code-only model whose behaviour each request chooses (fail, sleep, crash)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np

PHOTO_CODE = '''
"""Digits from a photo: decoded with Pillow, grey, 8x8, scaled to 0-16."""
import io
from pathlib import Path

import numpy as np
from PIL import Image

INPUTS = [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
OUTPUTS = [
    {"name": "digit", "datatype": "INT64", "shape": [-1]},
    {"name": "confidence", "datatype": "FP32", "shape": [-1]},
]
LABELS = (Path(__file__).parent / "labels.txt").read_text().split()


def pixels(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data)).convert("L").resize((8, 8), Image.Resampling.BOX)
    return np.asarray(image, dtype=np.float32).reshape(64) / 255.0 * 16.0


def preprocess(batch):
    return [{"pixels": np.stack([pixels(b) for b in r["image"]])} for r in batch]


def postprocess(batch):
    return [{"digit": np.array([int(LABELS[i]) for i in r["label"]], dtype=np.int64),
             "confidence": r["probabilities"].max(axis=1)} for r in batch]
'''

WHIMS_CODE = '''
"""Echoes text upper-cased; a request asks to fail ("raise"), to sleep ("sleep:S"),
or to take its worker down ("crash"). Counts its calls in calls.log beside it."""
import os
import time
from pathlib import Path

import numpy as np

INPUTS = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
OUTPUTS = [{"name": "shout", "datatype": "BYTES", "shape": [-1]}]
LOG = Path(os.environ.get("WHIMS_LOG", Path(__file__).parent / "calls.log"))


def one(text: bytes) -> bytes:
    with LOG.open("a") as log:
        log.write(text.decode() + "\\n")
    if text == b"raise":
        raise ValueError("asked to fail")
    if text.startswith(b"sleep:"):
        time.sleep(float(text[6:]))
    if text == b"crash":
        os.kill(os.getpid(), 9)
    return text.upper()


def postprocess(batch):
    return [{"shout": np.array([one(t) for t in r["text"]], dtype=object)} for r in batch]
'''


def digit_png(pixels: np.ndarray, size: int = 32) -> bytes:
    """A PNG of an 8x8 digits row (values 0-16), grey, `size` pixels square."""
    from PIL import Image

    grey = (np.asarray(pixels, dtype=np.float32).reshape(8, 8) / 16.0 * 255.0).astype(np.uint8)
    image = Image.fromarray(grey, mode="L").resize((size, size), Image.Resampling.NEAREST)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def photo_folder(folder: Path, digits_version: Path, example: bytes) -> Path:
    """The photo classifier as one model.py around a copy of the digits graph."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(digits_version / "model.onnx", folder / "model.onnx")
    (folder / "model.py").write_text(PHOTO_CODE)
    (folder / "labels.txt").write_text(" ".join(str(d) for d in range(10)) + "\n")
    (folder / "requirements.txt").write_text("pillow>=10\nnumpy\n")
    (folder / "seven.png").write_bytes(example)
    (folder / "examples.json").write_text(
        json.dumps([{"inputs": {"image": [{"file": "seven.png"}]}}])
    )
    return folder


def whims_folder(folder: Path, time_limit_s: float | None = None) -> Path:
    """The code-only model whose requests choose what it does."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(WHIMS_CODE)
    (folder / "examples.json").write_text(json.dumps({"inputs": {"text": ["hello"]}}))
    if time_limit_s is not None:
        card = {
            "platform": "python",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "shout", "datatype": "BYTES", "shape": [-1]}],
            "batching": {"max_batch_size": 64, "max_queue_delay_ms": 5},
            "time_limit_seconds": time_limit_s,
        }
        (folder / "card.json").write_text(json.dumps(card))
    return folder
