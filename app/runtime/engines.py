"""A process's decode engines: one per generative model version, made on first use
(its session, and its key/value cache), closed once the version stops serving and
no loop runs it any more, so an unloaded or removed model's cache leaves the
worker without a restart."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from app.cards import ModelCard
from app.runtime.decode import DecodeEngine
from app.runtime.sessions import SessionPool, release_memory


class EnginePool:
    def __init__(
        self, sessions: SessionPool, slots: int, prefill_tokens: int, prefix_bytes: int = 0,
        prefill_rows: int = 0,
    ) -> None:  # fmt: skip
        self._sessions, self.slots, self.prefill_tokens = sessions, slots, prefill_tokens
        self.prefix_bytes, self.prefill_rows = prefix_bytes, prefill_rows
        self._engines: dict[str, DecodeEngine] = {}
        self._running: Counter[str] = Counter()
        self._serving: set[str] | None = None  # as of the last `retain`
        self._lock = threading.Lock()

    @contextmanager
    def running(self, card: ModelCard) -> Iterator[DecodeEngine]:
        """The card's engine, kept while the block runs; closed as it ends if the
        version stopped serving meanwhile."""
        with self._lock:
            self._running[card.ref] += 1
        try:
            yield self._engine(card)
        finally:
            with self._lock:
                self._running[card.ref] -= 1
                if not self._running[card.ref]:
                    del self._running[card.ref]
                    gone = self._serving is not None and card.ref not in self._serving
            if gone:
                self.retain(self._serving or set())

    def loaded(self) -> list[str]:
        return list(self._engines)

    def retain(self, serving: set[str]) -> list[str]:
        """Close the engines (and sessions) of versions not in `serving` that no
        loop runs; the refs closed."""
        with self._lock:
            self._serving = set(serving)
            gone = [ref for ref in self._engines if ref not in serving and ref not in self._running]
            for ref in gone:
                del self._engines[ref]
            keep = serving | set(self._running)
        self._sessions.retain(keep)
        if gone:
            release_memory()
        return gone

    def _engine(self, card: ModelCard) -> DecodeEngine:
        assert card.generation is not None, f"{card.ref} is not a generative model"
        with self._lock:
            engine = self._engines.get(card.ref)
        if engine is None:
            engine = DecodeEngine(
                self._sessions.get(card), slots=self.slots,
                context=card.generation.context_length, stop_tokens=card.generation.stop_tokens,
                prefill_tokens=self.prefill_tokens, prefix_bytes=self.prefix_bytes,
                prefill_rows=self.prefill_rows,
            )  # fmt: skip
            with self._lock:
                engine = self._engines.setdefault(card.ref, engine)
        return engine
