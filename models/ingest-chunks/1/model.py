"""A document (UTF-8 text) cut into chunks of at most WORDS words, each with its
start and end character in the document: the first step of ingest."""

import re

import numpy as np

INPUTS = [{"name": "document", "datatype": "BYTES", "shape": [1]}]
OUTPUTS = [
    {"name": "chunks", "datatype": "BYTES", "shape": [-1]},
    {"name": "offsets", "datatype": "INT64", "shape": [-1, 2]},
]
WORDS = 40
_WORD = re.compile(r"\S+")


def chunks(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    spans = [
        (words[i][0], words[min(i + WORDS, len(words)) - 1][1]) for i in range(0, len(words), WORDS)
    ]
    return [text[a:b] for a, b in spans], spans


def preprocess(batch):
    out = []
    for request in batch:
        text = request["document"].reshape(-1)[0].decode("utf-8")
        pieces, spans = chunks(text)
        out.append(
            {
                "chunks": np.array(pieces, dtype=object),
                "offsets": np.array(spans, dtype=np.int64).reshape(-1, 2),
            }
        )
    return out
