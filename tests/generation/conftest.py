"""The bundled chat model as the engine-level tests read it: its card, its chat
format and a CPU session of its graph (two threads), once per module."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from app.cards import ModelCard
from app.generation.chat import ChatFormat
from app.platform.settings import ROOT
from modelbuild.bundled import ensure_models


@pytest.fixture(scope="module")
def card() -> ModelCard:
    ensure_models(ROOT / "models")
    return ModelCard.load(ROOT / "models" / "smollm2" / "1")


@pytest.fixture(scope="module")
def chat(card: ModelCard) -> ChatFormat:
    assert card.generation is not None
    return ChatFormat(card.path / "tokenizer.json", card.generation)


@pytest.fixture(scope="module")
def session(card: ModelCard) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(card.onnx_path), options, providers=["CPUExecutionProvider"])
