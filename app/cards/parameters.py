"""A generation's parameters, declared once: each one's name, the names OpenAI's
bodies give it, its kind, limits and default, and the words a value out of range
is refused with.

Every reader takes its list from here: the card's `generation.parameters`, the
request parser's checks and known names (app.generation.requests), the OpenAI
and Responses bodies' mappings (app.generation.openai_objects, .responses) and
the sampling's defaults (app.runtime.sampling.Sampling). It lives with the cards,
the lowest layer that all of them may import. A number or an integer is checked
here; a parameter of its own shape (`own`) by its own function in the parser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

Kind = Literal["number", "integer", "own"]


@dataclass(frozen=True)
class Parameter:
    """One parameter of a generation request.

    `low`/`high`: the limits of a number or integer, both allowed (`high` None: no
    upper limit); `above`: the low limit itself is refused, with `note` after the
    words. `words`: the range in the error's words where the limits would not say
    it so. `aliases`: OpenAI's names for it before its own, the first given
    winning. `responses`: the Responses API's name for it (None: not taken there).
    `json`: what an object or list parameter is, which a door of scalar
    parameters may send as its JSON in a string. `sampling`: a field of
    app.runtime.sampling.Sampling of the same name (else read into the request
    beside it, or into another parameter's field)."""

    name: str
    kind: Kind = "own"
    default: float | None = None
    low: float = 0
    high: float | None = None
    above: bool = False
    note: str = ""
    words: str = ""
    card_limits: bool = False  # the default and `high` are the card's (max_tokens)
    aliases: tuple[str, ...] = ()
    responses: str | None = None
    json: str = ""
    sampling: bool = True

    @property
    def openai(self) -> tuple[str, ...]:
        """The fields of OpenAI's chat and text completion bodies that carry it."""
        return (*self.aliases, self.name)

    def expected(self) -> str:
        if self.words:
            return self.words
        if self.kind == "number":
            return f"a number from {self.low:g} to {self.high:g}"
        if self.high is None:
            return f"an integer of {int(self.low)} or more"
        return f"an integer from {int(self.low)} to {int(self.high)}"

    def bounded(self, default: int, high: int) -> Parameter:
        """This parameter with a card's default and upper limit (max_tokens')."""
        return replace(self, default=default, high=high)

    def read(self, value: Any, errors: dict[str, str]) -> Any:
        """The value (its default when absent or null) as a float or an int; a value
        out of range is named in `errors` (and its default returned)."""
        if value is None:
            return None if self.default is None else self._typed(self.default)
        if not self._within(value):
            errors[self.name] = f"expected {self.expected()}, got {value!r}"
            return self.default
        if self.above and value == self.low:
            errors[self.name] = (
                f"expected a number above {self.low:g} and at most {self.high:g}{self.note}"
            )
        return self._typed(value)

    def _within(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind == "number":
            return isinstance(value, int | float) and math.isfinite(value) and (
                self.high is not None and self.low <= value <= self.high
            )  # fmt: skip
        return isinstance(value, int) and self.low <= value and (
            self.high is None or value <= self.high
        )  # fmt: skip

    def _typed(self, value: float) -> float | int:
        return float(value) if self.kind == "number" else int(value)


# In the order the card lists them and the parser checks them.
PARAMETERS = (
    Parameter("max_tokens", "integer", low=1, card_limits=True,
              aliases=("max_completion_tokens",), responses="max_output_tokens"),
    Parameter("temperature", "number", 1.0, low=0, high=2, responses="temperature"),
    Parameter("top_p", "number", 1.0, low=0, high=1, above=True, responses="top_p"),
    Parameter("top_k", "integer", 0, low=0, words="an integer of 0 (no limit) or more"),
    Parameter("seed", "integer", low=0, high=2**63 - 1, words="an integer from 0 to 2**63 - 1"),
    Parameter("stop"),
    Parameter("presence_penalty", "number", 0.0, low=-2, high=2),
    Parameter("frequency_penalty", "number", 0.0, low=-2, high=2),
    Parameter("repetition_penalty", "number", 1.0, low=0, high=10, above=True,
              note=" (1: none)"),
    Parameter("logit_bias", json="an object"),
    Parameter("logprobs"),
    Parameter("top_logprobs", sampling=False),  # (read into Sampling.logprobs)
    Parameter("response_format", json="an object", sampling=False),
    Parameter("labels", json="a list", sampling=False),
)  # fmt: skip
NAMES = tuple(parameter.name for parameter in PARAMETERS)
BY_NAME = {parameter.name: parameter for parameter in PARAMETERS}


def default(name: str) -> Any:
    """A declared parameter's default (for a Sampling field's own)."""
    return BY_NAME[name].default
