"""How many rows a chunk job takes: BATCH_CHUNK_ROWS, fewer where rows are large
(a chunk's inputs stay within BATCH_CHUNK_BYTES), or what the card says."""

from __future__ import annotations

from pathlib import Path

from app.batches.creation import Chunking, chunk_rows
from app.cards import Batching, ModelCard, TensorSpec
from app.platform.settings import Settings


def card(*inputs: TensorSpec, **extra: object) -> ModelCard:
    return ModelCard("m", "1", Path("."), inputs, (TensorSpec("y", "FP32", (-1, 1)),),
                     batching=Batching(max_batch_size=64), extra=dict(extra))  # fmt: skip


SETTINGS = Chunking.of(Settings(batch_chunk_rows=16384, batch_chunk_bytes=16 * 1024 * 1024))


def test_small_rows_take_the_rows_setting() -> None:
    assert chunk_rows(card(TensorSpec("pixels", "FP32", (-1, 64))), SETTINGS) == 16384


def test_large_rows_make_smaller_chunks_within_the_byte_bound() -> None:
    images = card(TensorSpec("image", "FP32", (-1, 3, 224, 224)), TensorSpec("k", "INT64", (-1,)))
    rows = chunk_rows(images, SETTINGS)
    assert rows == (16 * 1024 * 1024) // (3 * 224 * 224 * 4 + 8) == 27
    huge = card(TensorSpec("volume", "FP32", (-1, 512, 512, 512)))
    assert chunk_rows(huge, SETTINGS) == 1  # one row, however large


def test_rows_of_unknown_size_and_a_cards_own_figure() -> None:
    text = card(TensorSpec("text", "BYTES", (-1,)))
    free = card(TensorSpec("x", "FP32", (-1, -1)))
    assert chunk_rows(text, SETTINGS) == chunk_rows(free, SETTINGS) == 16384
    own = card(TensorSpec("image", "FP32", (-1, 3, 224, 224)), batch_chunk_rows=500)
    assert chunk_rows(own, SETTINGS) == 500
