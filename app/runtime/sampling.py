"""Picking the next token from a row of logits (numpy only).

Greedy is the arg max. Otherwise the logits are divided by the temperature,
cut to the top_k most likely (0: no cut), then to the smallest set whose
probability reaches top_p, and one token is drawn with the sequence's own
generator: a seed gives the same draws, so the same tokens, every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """How tokens are picked: greedy at temperature 0 (or top_k 1), otherwise
    sampled from the top_k most likely, then the top_p of probability mass; a
    seed makes a sampled run repeatable."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def generator(sampling: Sampling) -> np.random.Generator:
    return np.random.default_rng(sampling.seed)


def pick(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    if sampling.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scaled.size:
        candidates = np.argpartition(scaled, -sampling.top_k)[-sampling.top_k :]
    else:
        candidates = np.arange(scaled.size)
    order = candidates[np.argsort(scaled[candidates], kind="stable")[::-1]]
    weights = np.exp(scaled[order] - scaled[order[0]])
    probabilities = weights / weights.sum()
    if sampling.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probabilities), sampling.top_p)) + 1
        order, probabilities = order[:keep], probabilities[:keep] / probabilities[:keep].sum()
    return int(order[rng.choice(order.size, p=probabilities)])


def skip_draw(rng: np.random.Generator) -> None:
    """Advance a sequence's generator past one sampled token: `pick` draws exactly
    one uniform number a token (Generator.choice with p and no size), so a
    resumed sequence draws what an uninterrupted one would."""
    rng.random()
