"""A model's declared pre- and post-processing, run around its ONNX graph.

A card's `pipeline` names steps from `STEPS`; `run` applies them to a request
(or to several jobs' requests merged by the engine, which is why `tokenize`
pads to the longest text of the whole batch and `mean_pool` reads the mask):
pre steps on the card's inputs, the graph on what they made, post steps on its
outputs. Every door calls the engine, and the engine calls `run`, so the sync
door, inline models and async jobs give the same results. Cards without a
pipeline send their inputs to the graph as they are.

Steps see every tensor made so far by name and return the ones they add or
replace. Tokenizers are cached per model version per process, like sessions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.cards import ModelCard

if TYPE_CHECKING:
    from tokenizers import Tokenizer


Arrays = dict[str, np.ndarray]


class Graphs(Protocol):
    """What runs a card's ONNX graph (`app.runtime.sessions.SessionPool`): the steps
    need only this, so this module imports nothing of the sessions'."""

    def run(self, card: ModelCard, inputs: Arrays, names: list[str] | None = None) -> Arrays: ...


Step = Callable[[ModelCard, dict[str, Any], Arrays], Arrays]


def run(sessions: Graphs, card: ModelCard, inputs: Arrays) -> Arrays:
    """The card's outputs for `inputs` (the card's inputs, rows along axis 0).

    More rows than `max_batch_size` (a batch's chunk) run in calls of that many:
    each call pads to its own longest text, and attention's memory grows with
    rows x length squared."""
    spec = card.pipeline
    if spec is None:
        return sessions.run(card, inputs)
    limit, total = card.batching.max_batch_size, len(next(iter(inputs.values())))
    if 0 < limit < total:
        parts = [
            _run_steps(sessions, card, {k: v[i : i + limit] for k, v in inputs.items()})
            for i in range(0, total, limit)
        ]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    return _run_steps(sessions, card, inputs)


def _run_steps(sessions: Graphs, card: ModelCard, inputs: Arrays) -> Arrays:
    spec = card.pipeline
    assert spec is not None
    tensors = dict(inputs)
    for step in spec.pre:
        tensors |= STEPS[step["step"]](card, step, tensors)
    feeds = {s.name: tensors[s.name] for s in spec.model_inputs}
    tensors |= sessions.run(card, feeds, [s.name for s in spec.model_outputs])
    for step in spec.post:
        tensors |= STEPS[step["step"]](card, step, tensors)
    return {s.name: tensors[s.name] for s in card.outputs}


def tokenize(card: ModelCard, step: dict[str, Any], tensors: Arrays) -> Arrays:
    """BYTES text -> input_ids, attention_mask, token_type_ids (INT64, [rows,
    tokens]): cut to `max_length` word pieces (special tokens included), padded
    to the longest text of the call."""
    tokenizer = _tokenizer(card, _tokenizer_path(card, step), int(step["max_length"]))
    texts = [_text(item) for item in tensors[step["input"]].reshape(-1)]
    encodings = tokenizer.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def _text(item: str | bytes) -> str:
    """A BYTES element as text: bytes that are not UTF-8 fail their request."""
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("a BYTES element is not UTF-8 text; this model reads text") from None
    return str(item)


def mean_pool(card: ModelCard, step: dict[str, Any], tensors: Arrays) -> Arrays:
    """The mean of each row's token vectors over its attention mask (padding
    left out), as sentence-transformers' mean pooling."""
    tokens = tensors[step["input"]]
    mask = tensors[step.get("mask", "attention_mask")].astype(tokens.dtype)[:, :, None]
    counts = np.maximum(mask.sum(axis=1), 1e-9)
    return {step.get("output", step["input"]): (tokens * mask).sum(axis=1) / counts}


def l2_normalize(card: ModelCard, step: dict[str, Any], tensors: Arrays) -> Arrays:
    """Unit-length rows (cosine similarity becomes a dot product)."""
    vectors = tensors[step["input"]]
    norms = np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return {step.get("output", step["input"]): (vectors / norms).astype(vectors.dtype)}


STEPS: dict[str, Step] = {
    "tokenize": tokenize,
    "mean_pool": mean_pool,
    "l2_normalize": l2_normalize,
}


def load(card: ModelCard) -> None:
    """Read what the card's steps need (its tokenizer) now, not on the first job."""
    for step in card.pipeline.pre if card.pipeline else ():
        if step["step"] == "tokenize":
            _tokenizer(card, _tokenizer_path(card, step), int(step["max_length"]))


def text_tokenizer(card: ModelCard) -> tuple[Tokenizer, int] | None:
    """The tokenizer of the card's `tokenize` step and its max_length (it cuts
    longer text: its encodings' `overflowing` tells), None without one."""
    for step in card.pipeline.pre if card.pipeline else ():
        if step["step"] == "tokenize":
            length = int(step["max_length"])
            return _tokenizer(card, _tokenizer_path(card, step), length), length
    return None


def retain(serving: set[str]) -> None:
    """Forget the tokenizers of versions that no longer serve."""
    with _lock:
        for key in [key for key in _tokenizers if key[0] not in serving]:
            del _tokenizers[key]


def unknown_steps(card: ModelCard) -> list[str]:
    """Step names the card declares that this code does not know."""
    if card.pipeline is None:
        return []
    return [s["step"] for s in (*card.pipeline.pre, *card.pipeline.post) if s["step"] not in STEPS]


# (model ref, tokenizer file) -> (its mtime, max_length, tokenizer): a replaced file is read again.
_tokenizers: dict[tuple[str, Path], tuple[int, int, Tokenizer]] = {}
_lock = threading.Lock()


def _tokenizer_path(card: ModelCard, step: dict[str, Any]) -> Path:
    return card.path / step.get("tokenizer", "tokenizer.json")


def _tokenizer(card: ModelCard, path: Path, max_length: int) -> Tokenizer:
    key, mtime = (card.ref, path), path.stat().st_mtime_ns
    cached = _tokenizers.get(key)
    if cached is None or cached[:2] != (mtime, max_length):
        with _lock:
            cached = _tokenizers.get(key)
            if cached is None or cached[:2] != (mtime, max_length):
                cached = (mtime, max_length, _load_tokenizer(path, max_length))
                _tokenizers[key] = cached
    return cached[2]


def _load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    # The shipped file pads every text to 128 tokens and cuts there; the model is
    # used with 256 (sentence_bert_config.json) and padding to the longest text.
    tokenizer.enable_truncation(max_length=max_length)
    pad = tokenizer.padding or {}
    tokenizer.enable_padding(
        pad_id=int(pad.get("pad_id", 0)), pad_token=str(pad.get("pad_token", "[PAD]"))
    )
    return tokenizer
