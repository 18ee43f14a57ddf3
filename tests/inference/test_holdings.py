"""What a process holds per model version follows the repository: sessions bounded
by MAX_LOADED_MODELS (least recently used closed first, a card's keep-alive
respected), closed when their version stops serving; decode engines closed once
their version stops serving and no loop runs them. Real ONNX Runtime sessions."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.cards import ModelCard
from app.repository.registry import ModelRepository
from app.runtime.engines import EnginePool
from app.runtime.sessions import SessionPool


@pytest.fixture
def copies(model_repository: Path, tmp_path: Path) -> ModelRepository:
    """digits as `a`, `b` and `c`, and `kept`, whose card keeps it an hour after use."""
    for name in ("a", "b", "c", "kept"):
        shutil.copytree(model_repository / "digits", tmp_path / name)
    card = tmp_path / "kept" / "1" / "card.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "keep_alive_seconds": 3600}))
    return ModelRepository(tmp_path)


def cards(repository: ModelRepository, *names: str) -> list[ModelCard]:
    return [repository.resolve(name) for name in names]


def test_past_its_bound_the_pool_closes_the_least_recently_used(
    copies: ModelRepository,
) -> None:
    pool = SessionPool("cpu", 1, max_loaded=2)
    a, b, c = cards(copies, "a", "b", "c")
    pool.get(a)
    pool.get(b)
    pool.get(a)  # used again: b is now the least recently used
    pool.get(c)
    assert sorted(pool.loaded()) == ["a:1", "c:1"]
    pool.get(b)  # loaded again when asked for
    assert sorted(pool.loaded()) == ["b:1", "c:1"]


def test_a_card_kept_alive_is_not_closed_for_the_bound(copies: ModelRepository) -> None:
    pool = SessionPool("cpu", 1, max_loaded=2)
    kept, a, b = cards(copies, "kept", "a", "b")
    pool.get(kept)
    pool.get(a)
    pool.get(b)  # the least recently used is `kept`, within its keep-alive: `a` goes
    assert sorted(pool.loaded()) == ["b:1", "kept:1"]


def test_without_a_bound_every_session_stays_until_its_version_stops_serving(
    copies: ModelRepository,
) -> None:
    pool = SessionPool("cpu", 1)
    a, b, c = cards(copies, "a", "b", "c")
    session = pool.get(a)
    for card in (b, c):
        pool.get(card)
    assert sorted(pool.loaded()) == ["a:1", "b:1", "c:1"]
    assert sorted(pool.retain({"b:1"})) == ["a:1", "c:1"]
    assert pool.loaded() == ["b:1"]
    # A run that had the session before it was closed finishes on it.
    outputs = session.run(None, {"pixels": np.zeros((1, 64), np.float32)})
    assert len(outputs) == 2


def test_a_decode_engine_is_closed_once_its_version_stops_serving_and_no_loop_runs_it(
    model_repository: Path,
) -> None:
    repository = ModelRepository(model_repository)
    chat = repository.resolve("smollm2")
    engines = EnginePool(SessionPool("cpu", 1), slots=2, prefill_tokens=64)
    with engines.running(chat):
        assert engines.retain(set()) == [], "a loop runs it: kept"
        assert engines.loaded() == [chat.ref]
    assert engines.loaded() == [], "closed as its loop ended"
    assert engines.retain({chat.ref}) == []  # loaded again: it serves
    with engines.running(chat):
        pass
    assert engines.loaded() == [chat.ref], "kept after its loop: it serves"
    assert engines.retain(set()) == [chat.ref] and engines.loaded() == []


def test_a_version_whose_file_goes_while_it_serves_keeps_its_session_until_dropped(
    copies: ModelRepository,
) -> None:
    """A model removed under a call of it: the call, whichever new card it looks
    through, finishes on the session loaded; only a version never loaded fails."""
    pool = SessionPool("cpu", 1)
    (a,) = cards(copies, "a")
    session = pool.get(a)
    shutil.rmtree(a.onnx_path.parent.parent)
    again = dataclasses.replace(a)  # a rescan's card: the file is looked at again
    assert again is not a
    assert pool.get(again) is session
    outputs = pool.run(again, {"pixels": np.zeros((1, 64), np.float32)})
    assert set(outputs) == {spec.name for spec in a.outputs}
    (b,) = cards(copies, "b")
    shutil.rmtree(b.onnx_path.parent.parent)
    with pytest.raises(FileNotFoundError):
        pool.get(b)
    assert pool.retain(set()) == ["a:1"]
