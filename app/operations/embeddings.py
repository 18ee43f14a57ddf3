"""Embeddings of texts as a sync call: OpenAI's /v1/embeddings over the one call path.

A request is a sync call of an embedding model (a card whose pipeline tokenizes
text and whose one output is a [rows, dimensions] FP32 tensor), so it is a job
record, counted against the tenant's quotas and waits, and run by the same
micro-batching workers as /v2/models/<m>/infer: its vectors are the ones the
other doors give for the same text. Token arrays (OpenAI's other input form) are
decoded with the model's own tokenizer and embedded as that text. An input
longer than the model takes is refused here, naming it, rather than cut.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.cards import ModelCard
from app.generation.openai_objects import BadField
from app.operations.calls import CallOperations
from app.operations.requests import InferRequest
from app.operations.submission import Submitter
from app.runtime.pipeline import text_tokenizer
from app.tenancy.keys import TenantRef

MAX_INPUTS = 2048  # texts in one request, as OpenAI allows


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray  # [inputs, dimensions] float32
    tokens: int  # the inputs' tokens (their usage)
    job_id: uuid.UUID | None


class Embeddings:
    def __init__(self, calls: CallOperations, submitter: Submitter) -> None:
        self._calls, self._submitter = calls, submitter

    def embed(self, tenant: TenantRef, model: str, inputs: Any, dimensions: Any = None) -> Embedded:
        """The inputs' vectors, one sync call; BadField names a field at fault."""
        card = self._submitter.card(tenant, model, None)
        found = text_tokenizer(card) if _embeds(card) else None
        if found is None:
            raise BadField("model", f"{model} does not make embeddings (a text-embedding model)")
        tokenizer, max_length = found
        texts = _texts(inputs, tokenizer)
        encodings = tokenizer.encode_batch(texts)
        for i, encoding in enumerate(encodings):
            if encoding.overflowing:
                where = "input" if isinstance(inputs, str) else f"input[{i}]"
                raise BadField(where, f"is more than {max_length} tokens, what {model} takes; "
                               "split the text")  # fmt: skip
        width = card.outputs[0].shape[-1]
        if dimensions is not None and dimensions != width:
            raise BadField("dimensions", f"{model} makes vectors of {width} dimensions only")
        answer = self._calls.infer(tenant, InferRequest(model, {card.inputs[0].name: texts}))
        vectors = np.asarray(answer.outputs[card.outputs[0].name], np.float32)
        tokens = int(sum(sum(encoding.attention_mask) for encoding in encodings))
        return Embedded(vectors, tokens, answer.job_id)


def _embeds(card: ModelCard) -> bool:
    """One BYTES input of texts, one FP32 output of a vector per text."""
    return (
        card.generation is None and len(card.inputs) == 1 and len(card.outputs) == 1
        and card.inputs[0].datatype == "BYTES" and card.outputs[0].datatype == "FP32"
        and len(card.outputs[0].shape) == 2 and card.outputs[0].shape[-1] > 0
    )  # fmt: skip


def _texts(inputs: Any, tokenizer: Any) -> list[str]:
    """OpenAI's `input`: a string, a list of strings, a token array or a list of
    them (decoded with the model's tokenizer)."""
    expected = "a string, a list of strings, a list of token ids or a list of such lists"
    one = isinstance(inputs, str) or (
        isinstance(inputs, list) and bool(inputs) and all(_token(t) for t in inputs)
    )
    if one:
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise BadField("input", f"expected {expected}")
    if len(inputs) > MAX_INPUTS:
        raise BadField("input", f"at most {MAX_INPUTS} inputs in one request, got {len(inputs)}")
    vocabulary = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = []
    for i, item in enumerate(inputs):
        where = "input" if one else f"input[{i}]"
        if isinstance(item, list) and item and all(_token(t) for t in item):
            if unknown := [t for t in item if t >= vocabulary]:
                raise BadField(where, f"token id(s) {unknown[:5]} are not in the model's "
                               f"vocabulary (0 to {vocabulary - 1})")  # fmt: skip
            item = tokenizer.decode(item, skip_special_tokens=True)
        if not isinstance(item, str) or not item:
            raise BadField(where, f"expected a non-empty string or token ids: {expected}")
        texts.append(item)
    return texts


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
