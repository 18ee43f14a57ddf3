"""The client's embeddings against the real service (POST /v1/embeddings, a sync
call on a real worker): sentence-transformers' vectors for `minilm`, and the
OpenAI-shaped errors of /v1 read into `ApiError`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inference_client import ApiError, Client

REFERENCE = json.loads(
    (Path(__file__).parent.parent / "data" / "minilm_reference.json").read_text(encoding="utf-8")
)
# /v1 refuses an empty input and one longer than the model takes (the reference's
# last, which the tensor doors cut): the others, with their reference vectors.
KEPT = [i for i, text in enumerate(REFERENCE["sentences"]) if text and len(text) < 500]
SENTENCES: list[str] = [REFERENCE["sentences"][i] for i in KEPT]
EXPECTED = np.asarray(REFERENCE["embeddings"], dtype=np.float32)[KEPT]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        (a * b).sum(axis=-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    )


@pytest.mark.usefixtures("worker")
def test_a_vector_per_input_equal_to_the_reference(api: Client) -> None:
    vectors = api.embeddings.create("minilm", SENTENCES)
    assert len(SENTENCES) == 7  # unicode, whitespace and a repeated sentence among them
    assert isinstance(vectors, list) and len(vectors) == len(SENTENCES)
    assert all(len(v) == 384 and all(isinstance(x, float) for x in v) for v in vectors)
    got = np.asarray(vectors, dtype=np.float32)
    assert cosine(got, EXPECTED).min() >= 0.999  # in input order: each its own sentence
    [one] = api.embeddings.create("minilm", SENTENCES[2])  # a single string: one vector
    assert cosine(np.asarray(one, np.float32), EXPECTED[2]) >= 0.999


@pytest.mark.usefixtures("worker")
def test_openai_shaped_errors_become_api_errors_with_the_message(api: Client) -> None:
    with pytest.raises(ApiError) as not_embedding:
        api.embeddings.create("smollm2", "hello")
    error = not_embedding.value
    assert error.status == 400 and error.type == "invalid_request_error"
    assert "does not make embeddings" in error.detail and error.detail in str(error)
    assert error.problem["param"] == "model" and json.loads(error.body)["error"] == error.problem

    with pytest.raises(ApiError) as too_long:
        api.embeddings.create("minilm", ["short", "word " * 2000])
    assert too_long.value.status == 400 and too_long.value.problem["param"] == "input[1]"
    assert "split the text" in too_long.value.detail

    with pytest.raises(ApiError) as unknown:
        api.embeddings.create("no-such-model", "hello")
    assert unknown.value.status == 404 and unknown.value.detail and unknown.value.title
    assert unknown.value.problem["type"] == unknown.value.type == "not_found_error"
