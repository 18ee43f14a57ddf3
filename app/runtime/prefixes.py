"""A decode engine's prefix cache: the key/value cache rows of prompts it prefilled,
kept so that a later prompt starting with the same tokens copies them instead of
prefilling them again (a chat's system prompt, a batch's shared instruction, a
paused generation going on).

Rows are kept in blocks of BLOCK tokens: a prompt's rows are kept up to its last
whole block, and a prompt finds the longest kept run of whole blocks it starts
with, leaving at least its last token to prefill (its logits give the first
token). Entries are found by a chained digest of their blocks, per owner (the
tenant), so one tenant never reads rows another tenant's prompt made, nor learns
from a hit what another tenant asked. The rows are bounded in bytes; the least
recently used entry goes first. Everything here runs on the decode loop's thread.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Tokens a block of kept rows holds: small, since the commonest shared prefix is a
# chat template's default system prompt (24 tokens for SmolLM2), and a hit's copy
# costs far less than the prefill it saves (the rows prefilled again after a hit
# are the same, bit for bit).
BLOCK = 8
MIN_BLOCKS = 2  # a prompt of fewer whole blocks is not kept: its prefill is cheap


@dataclass(eq=False)
class Kept:
    owner: Any
    tokens: tuple[int, ...]  # whole blocks
    rows: Any  # the cache's saved rows of those tokens (app.runtime.kvcache)
    nbytes: int
    keys: list[tuple[Any, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class Hit:
    rows: Any
    tokens: int  # the prompt's first `tokens` are in `rows`


@dataclass
class PrefixCounts:
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0


def _digests(tokens: Sequence[int], blocks: int) -> list[bytes]:
    """The chained digest after each of the first `blocks` blocks."""
    out, last = [], b""
    flat = np.asarray(tokens[: blocks * BLOCK], np.int64).tobytes()
    step = BLOCK * 8
    for i in range(blocks):
        last = hashlib.blake2b(last + flat[i * step : (i + 1) * step], digest_size=16).digest()
        out.append(last)
    return out


class PrefixCache:
    def __init__(self, budget_bytes: int, token_bytes: int) -> None:
        self.budget, self.token_bytes = budget_bytes, token_bytes
        self.held = 0  # bytes of rows kept
        self._entries: OrderedDict[int, Kept] = OrderedDict()  # least recently used first
        self._index: dict[tuple[Any, bytes], list[Kept]] = {}
        self.counts = PrefixCounts()  # since the last `take_counts`

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, owner: Any, prompt: Sequence[int]) -> Hit | None:
        """The longest kept prefix of `prompt` (whole blocks, its last token left
        out) among `owner`'s entries; counted as a hit or a miss."""
        usable = (len(prompt) - 1) // BLOCK
        if usable >= MIN_BLOCKS:
            digests = _digests(prompt, usable)
            for blocks in range(usable, 0, -1):
                for kept in reversed(self._index.get((owner, digests[blocks - 1]), [])):
                    n = blocks * BLOCK
                    if tuple(prompt[:n]) == kept.tokens[:n]:  # (not a digest collision)
                        self._entries.move_to_end(id(kept))
                        self.counts.hits += 1
                        self.counts.tokens_saved += n
                        return Hit(kept.rows, n)
        self.counts.misses += 1
        return None

    def keep(self, owner: Any, prompt: Sequence[int], save: Callable[[int], Any]) -> None:
        """Keep the rows of `prompt`'s whole blocks (`save(n)` copies the first n
        positions out of the cache), unless they are kept already or too few."""
        blocks = len(prompt) // BLOCK
        n, nbytes = blocks * BLOCK, blocks * BLOCK * self.token_bytes
        if blocks < MIN_BLOCKS or nbytes > self.budget:
            return
        digests = _digests(prompt, blocks)
        tokens = tuple(prompt[:n])
        for kept in self._index.get((owner, digests[-1]), []):
            if kept.tokens[:n] == tokens:
                self._entries.move_to_end(id(kept))
                return
        while self._entries and self.held + nbytes > self.budget:
            self._drop(next(iter(self._entries.values())))
        kept = Kept(owner, tokens, save(n), nbytes)
        kept.keys = [(owner, d) for d in digests]
        for key in kept.keys:
            self._index.setdefault(key, []).append(kept)
        self._entries[id(kept)] = kept
        self.held += nbytes

    def clear(self) -> None:
        for kept in list(self._entries.values()):
            self._drop(kept)

    def take_counts(self) -> PrefixCounts:
        counts, self.counts = self.counts, PrefixCounts()
        return counts

    def _drop(self, kept: Kept) -> None:
        del self._entries[id(kept)]
        self.held -= kept.nbytes
        for key in kept.keys:
            entries = self._index[key]
            entries.remove(kept)
            if not entries:
                del self._index[key]
