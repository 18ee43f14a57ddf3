"""One ChatFormat per generative model version and process, loaded on first use (the
API checks prompts' lengths with it; workers encode and decode with it)."""

from __future__ import annotations

import threading

from app.cards import ModelCard
from app.generation.chat import ChatFormat

_formats: dict[tuple[str, int], ChatFormat] = {}
_lock = threading.Lock()


def chat_format(card: ModelCard) -> ChatFormat:
    assert card.generation is not None, f"{card.ref} is not a generative model"
    path = card.path / "tokenizer.json"
    key = (card.ref, path.stat().st_mtime_ns)
    with _lock:
        if key not in _formats:
            _formats[key] = ChatFormat(path, card.generation)
        return _formats[key]


def retain(serving: set[str]) -> None:
    """Forget the formats of versions that no longer serve (and of replaced files)."""
    with _lock:
        for key in [key for key in _formats if key[0] not in serving]:
            del _formats[key]
