"""Label scores: how likely each candidate label is as the answer to a prompt, read
from the model rather than sampled.

A label's score is the log-probability of its tokens after the prompt (the sum
over its tokens, each given the ones before); the scores, soft-maxed over the
labels, are their probabilities, summing to 1. The prompt is prefilled once:
its last logits score every label's first token. A label of more tokens is fed
through the decode steps after it, one token a step in the sequence's one slot,
batched with every other sequence's step; between labels the sequence rewinds
to the prompt's end, so each label is read against the prompt's own cache rows
and no slot is taken for a label.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    peak = float(np.max(row))
    return row - (peak + float(np.log(np.sum(np.exp(row - peak)))))


@dataclass(eq=False)
class LabelScores:
    labels: list[list[int]]  # each label's token ids
    start: int = -1  # the prompt's positions (where every label begins)
    sums: list[float] = field(init=False)  # each label's log-probability so far
    label: int = -1  # the label being fed
    at: int = 0  # how many of its tokens are fed

    def __post_init__(self) -> None:
        self.sums = [0.0] * len(self.labels)

    def fresh(self) -> LabelScores:
        """The same labels, unscored (a sequence read again from its prompt)."""
        return LabelScores(self.labels)

    def first(self, logits: np.ndarray, prompt_positions: int) -> bool:
        """The prompt's last logits: every label's first token scored. True when
        no label has more tokens to feed."""
        logprobs = log_softmax(logits)
        self.start = prompt_positions
        self.sums = [float(logprobs[tokens[0]]) for tokens in self.labels]
        return self._next_label(0)

    def feed(self) -> int:
        """The token the next decode step feeds (the current label's next)."""
        return self.labels[self.label][self.at - 1]

    def take(self, logits: np.ndarray) -> bool:
        """The logits after the fed token: the label's next token scored. True
        when every label is scored."""
        tokens = self.labels[self.label]
        self.sums[self.label] += float(log_softmax(logits)[tokens[self.at]])
        self.at += 1
        if self.at < len(tokens):
            return False
        return self._next_label(self.label + 1)

    def _next_label(self, first: int) -> bool:
        for index in range(first, len(self.labels)):
            if len(self.labels[index]) > 1:
                self.label, self.at = index, 1
                return False
        self.label = -1
        return True

    def probabilities(self) -> list[float]:
        sums = np.array(self.sums)
        weights = np.exp(sums - sums.max())
        return [float(p) for p in weights / weights.sum()]
