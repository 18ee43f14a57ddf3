"""A generation's sequence as the decode engine (app.runtime.decode) holds it: its
prompt, sampling, guide and what it made, and what a step emits for it. Apart from
the engine because the loop around it (app.operations) and the one-shot path
(app.generation.oneshot) make and read sequences without the engine's internals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from app.runtime.labels import LabelScores
from app.runtime.sampling import Sampling, Seen, TokenLogprob, generator, skip_draw


class Guide(Protocol):
    """What a sequence's output must match (a grammar: app.generation.guides)."""

    def mask(self, logits: np.ndarray, left: int) -> np.ndarray:
        """The row with every token the grammar forbids next at -inf (a copy);
        `left`: the tokens the sequence may still make."""

    def accept(self, token: int) -> None:
        """The token was picked: the grammar moves past it."""

    @property
    def finished(self) -> bool:
        """The output is whole: nothing may follow."""


@dataclass(eq=False)
class Sequence:
    key: Any  # the caller's name for it (a job id)
    prompt: list[int]
    sampling: Sampling
    guide: Guide | None = None
    scores: LabelScores | None = None  # labels to score instead of generating
    owner: Any = None  # whose prompt it is (a tenant): kept prefixes are per owner
    rng: np.random.Generator = field(init=False)
    seen: Seen = field(init=False)
    generated: list[int] = field(default_factory=list)
    slot: int = -1
    filled: int = 0  # positions of its cache rows written
    prompt_logits: np.ndarray | None = None  # the prompt's last logits, for a twin
    finish_reason: str | None = None
    looked: bool = False  # the kept prefixes were searched for its prompt

    def __post_init__(self) -> None:
        self.rng = generator(self.sampling)
        self.seen = Seen(self.prompt, self.sampling)

    @classmethod
    def resumed(
        cls, key: Any, prompt: list[int], made: list[int], sampling: Sampling,
        guide: Guide | None = None, owner: Any = None,
    ) -> Sequence:  # fmt: skip
        """A sequence going on from tokens an earlier run made: they are prefilled
        with the prompt and count as generated (for the penalties and the guide
        too), and a seeded generator draws as many times as it drew for them, so
        the rest is what one uninterrupted run makes."""
        sequence = cls(key, prompt + made, sampling, guide, owner=owner)
        sequence.seen = Seen(prompt, sampling)
        sequence.generated = list(made)
        for token in made:
            sequence.seen.add(token)
            if guide is not None:
                guide.accept(token)
            if not sampling.greedy:
                skip_draw(sequence.rng)
        return sequence

    def going_on(self, prompt: list[int]) -> Sequence:
        """This sequence again from its prompt and tokens (a paused one going on):
        its generator, penalties and guide where they were."""
        scores = self.scores.fresh() if self.scores is not None else None
        again = Sequence(self.key, prompt + self.generated, self.sampling, self.guide, scores,
                         self.owner)  # fmt: skip
        again.generated, again.rng, again.seen = list(self.generated), self.rng, self.seen
        return again


@dataclass(frozen=True)
class Emitted:
    """What a step made of one sequence: a token (None when it ended on a stop
    token, which is not part of the text) and, if it ended, why."""

    sequence: Sequence
    token: int | None
    finished: str | None  # "stop", "length" or None
    logprob: TokenLogprob | None = None  # when the sampling asks for log-probabilities
