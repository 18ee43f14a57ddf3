"""A user's own GGUF file as a model version: `manage.py models add model.gguf` (and
the repository door) build its graph and tokenizer here, and its card from the
file's metadata: the context, the control tokens, the stop tokens and, for a
ChatML chat template (SmolLM2, Qwen2), the chat roles and the default system
message the template writes; with another template (Llama 3's, for one), the
template itself, rendered in Jinja's sandbox with the messages' text kept out of
its control tokens (app.generation.templates). A file with no template is served
as a prompt-only model.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from modelbuild.files import with_metadata, write_atomically
from modelbuild.gguf_file import (
    CONTROL,
    USER_DEFINED,
    UnsupportedModel,
    read_gguf,
    tokenizer_json,
)

WEIGHTS = ("int4", "fp32")
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # files whose linear weights are 4-bit already
MAX_TOKENS = 2048  # a call's ceiling, as the bundled chat model's card sets it
# Ends of text or of a turn, stops wherever a file has them as control tokens.
_END_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>",
               "<|end|>", "</s>")  # fmt: skip
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\\n|\n)(.*?)<\|im_end\|>", re.S)

__all__ = ["WEIGHTS", "UnsupportedModel", "build_own_gguf"]


def build_own_gguf(source: Path, target: Path, weights: str | None = None) -> dict[str, Any]:
    """Write `model.onnx` and `tokenizer.json` into `target` from the GGUF file
    `source`; the card (a dict) for them. `weights`: int4 (MatMulNBits blocks) or
    fp32; by default int4 where the file's feed-forward weights are 4-bit already
    (nothing more is lost), else fp32 (4-bit blocks quantised from 8-bit or float
    values move the logits much more). UnsupportedModel names what cannot be
    served; ValueError a `weights` that is not one of WEIGHTS."""
    import onnx

    from modelbuild.llama_graph import llama_graph

    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: one of {', '.join(WEIGHTS)}")
    hyper, tensors, tokenizer = read_gguf(source)
    if weights is None:
        kind = tensors["blk.0.ffn_up.weight"].tensor_type.name
        weights = "int4" if kind in FOUR_BIT else "fp32"
    generation = _generation(hyper, tokenizer)
    model = llama_graph(hyper, tensors, weights, generation["context_length"])
    facts = {"source": source.name, "weights": weights, "architecture": hyper["arch"],
             "layers": str(hyper["layers"]), "hidden": str(hyper["hidden"]),
             "gguf": importlib.metadata.version("gguf"), "onnx": onnx.__version__}  # fmt: skip
    write_atomically(target / "model.onnx", with_metadata(model, facts))
    write_atomically(target / "tokenizer.json", tokenizer_json(tokenizer).encode())
    chat = "a chat model or " if generation["roles"] else ""
    return {
        "description": f"{hyper['name']}: {chat}a prompt to continue; {hyper['arch']} "
        f"architecture, {hyper['layers']} layers, built from {source.name} ({weights}).",
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
        "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
        "generation": generation,
        "made_by": {"command": "models add", **facts},
    }  # fmt: skip


def _generation(hyper: dict[str, Any], tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The card's `generation` from the file: its context (what a slot's cache may
    reach), its control tokens, and what stops a generation."""
    tokens, template = list(tokenizer["tokens"]), tokenizer["template"]
    ids = {token: i for i, token in enumerate(tokens)}
    types = list(tokenizer["types"]) if tokenizer["types"] is not None else [1] * len(tokens)
    eos = int(tokenizer["eos"])
    special: dict[str, int] = {"eos": eos}
    if tokenizer["bos"] is not None:
        special["bos"] = int(tokenizer["bos"])
    stops = {eos} | {ids[t] for t in _END_TOKENS if t in ids and types[ids[t]] == CONTROL}
    if tokenizer["eot"] is not None:
        stops.add(int(tokenizer["eot"]))
    roles: list[str] = []
    default_system = None
    own: dict[str, Any] = {}
    if "<|im_start|>" in template and "<|im_start|>" in ids and "<|im_end|>" in ids:
        special |= {"im_start": ids["<|im_start|>"], "im_end": ids["<|im_end|>"]}
        stops.add(ids["<|im_end|>"])
        roles = ["system", "user", "assistant"]
        found = _DEFAULT_SYSTEM.search(template)
        default_system = found.group(1) if found else None
    elif template:  # the file's own template, rendered in Jinja's sandbox
        named = {i for i in (special.get("bos"), eos) if i is not None}
        control = {token: i for i, token in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)
                   and (token in template or i in named) and token}  # fmt: skip
        own = {"chat_template": template, "control": control}
        roles = ["system", "user", "assistant"]
    if tokenizer["add_bos"] and "bos" in special:
        own["add_bos"] = True
    context = int(hyper["context"])
    if context < 16:
        raise UnsupportedModel(f"a context of {context} positions")
    max_tokens = min(MAX_TOKENS, context - 1)
    return {
        "context_length": context, "max_tokens": max_tokens,
        "default_max_tokens": min(256, max_tokens), "roles": roles,
        "default_system": default_system, "special": special, "stop_tokens": sorted(stops),
        **own,
    }  # fmt: skip
