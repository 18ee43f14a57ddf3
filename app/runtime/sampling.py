"""Picking the next token from a row of logits (numpy only).

The logits are first shaped: a guide (a grammar) takes out the tokens it
forbids, `logit_bias` adds to the tokens it names, and the penalties lower the
tokens already seen (OpenAI's presence and frequency penalties over the tokens
generated; the repetition penalty of Hugging Face and vLLM over the prompt's
too, dividing a positive logit and multiplying a negative one). Log-probabilities
are read from the shaped row at temperature 1, so a token a guide forbids has
none.

Greedy is the arg max. Otherwise the logits are divided by the temperature,
cut to the top_k most likely (0: no cut), then to the smallest set whose
probability reaches top_p, and one token is drawn with the sequence's own
generator: a seed gives the same draws, so the same tokens, every run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from app.cards.parameters import default


@dataclass(frozen=True)
class Sampling:
    """How tokens are picked: greedy at temperature 0 (or top_k 1), otherwise
    sampled from the top_k most likely, then the top_p of probability mass; a
    seed makes a sampled run repeatable. `logprobs`: None, or how many of the
    most likely alternatives each token's log-probability comes with (0 to 20).
    The fields are the parameters app.cards.parameters declares for it, a
    number's or an integer's default the declared one."""

    max_tokens: int
    temperature: float = default("temperature")
    top_p: float = default("top_p")
    top_k: int = default("top_k")
    seed: int | None = default("seed")
    stop: tuple[str, ...] = ()
    presence_penalty: float = default("presence_penalty")
    frequency_penalty: float = default("frequency_penalty")
    repetition_penalty: float = default("repetition_penalty")
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def shaped(self) -> bool:
        """Whether the logits are changed before the pick (else read as they are)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.logit_bias
            or self.repetition_penalty != 1.0
        )  # fmt: skip


@dataclass(frozen=True)
class TokenLogprob:
    """A picked token's log-probability and the `top` most likely tokens' (best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Seen:
    """The tokens a sequence's penalties look at: those generated (presence and
    frequency), and those of the prompt besides (repetition)."""

    def __init__(self, prompt: list[int], sampling: Sampling) -> None:
        self.generated: Counter[int] = Counter()
        self.prompt = (
            np.unique(np.asarray(prompt, np.int64)) if sampling.repetition_penalty != 1.0
            else np.empty(0, np.int64)
        )  # fmt: skip

    def add(self, token: int) -> None:
        self.generated[token] += 1


def generator(sampling: Sampling) -> np.random.Generator:
    return np.random.default_rng(sampling.seed)


def shape(logits: np.ndarray, sampling: Sampling, seen: Seen) -> np.ndarray:
    """The row with the bias and the penalties applied (a copy; the row as it is
    when the sampling changes nothing)."""
    if not sampling.shaped:
        return logits
    out = logits.astype(np.float32, copy=True)
    if sampling.repetition_penalty != 1.0:
        ids = np.union1d(seen.prompt, np.fromiter(seen.generated, np.int64))
        values = out[ids]
        out[ids] = np.where(values > 0, values / sampling.repetition_penalty,
                            values * sampling.repetition_penalty)  # fmt: skip
    if seen.generated and (sampling.presence_penalty or sampling.frequency_penalty):
        ids = np.fromiter(seen.generated.keys(), np.int64, len(seen.generated))
        counts = np.fromiter(seen.generated.values(), np.float32, len(seen.generated))
        out[ids] -= sampling.frequency_penalty * counts + sampling.presence_penalty
    for token, bias in sampling.logit_bias:
        out[token] += bias
    return out


def pick(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    if sampling.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scaled.size:
        candidates = np.argpartition(scaled, -sampling.top_k)[-sampling.top_k :]
    else:
        candidates = np.arange(scaled.size)
    order = candidates[np.argsort(scaled[candidates], kind="stable")[::-1]]
    order = order[np.isfinite(scaled[order])]  # (a guide's forbidden tokens: -inf)
    weights = np.exp(scaled[order] - scaled[order[0]])
    probabilities = weights / weights.sum()
    if sampling.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probabilities), sampling.top_p)) + 1
        order, probabilities = order[:keep], probabilities[:keep] / probabilities[:keep].sum()
    return int(order[rng.choice(order.size, p=probabilities)])


def logprob_of(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The token's log-probability under the row (temperature 1), with the `top`
    most likely tokens' (ties in token order)."""
    row = logits.astype(np.float64)
    peak = float(np.max(row))
    total = peak + float(np.log(np.sum(np.exp(row - peak))))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(-row, top - 1)[:top]
        ids = ids[np.lexsort((ids, -row[ids]))]
        best = tuple((int(i), float(row[i] - total)) for i in ids)
    return TokenLogprob(token, float(row[token] - total), best)


def skip_draw(rng: np.random.Generator) -> None:
    """Advance a sequence's generator past one sampled token: `pick` draws exactly
    one uniform number a token (Generator.choice with p and no size), so a
    resumed sequence draws what an uninterrupted one would."""
    rng.random()
