"""The one way a model runs on a micro-batch, for every caller: async jobs (the
runner), sync calls on the lane (the workers' lane threads) and inline calls (in
the API). Each hands over checked inputs, one dict of arrays an item, and gets
one outcome an item, in order: its outputs with its share of the call's time, or
the failure that ended it, named by the same codes everywhere:

- `model_unavailable`: the version does not serve (unloaded, removed or out of
  its version policy since the item was sent);
- `model_invalid`: its file is missing, corrupt or unlike its card;
- `non_finite_output`: the model gave NaN or infinity for this item;
- `inference_error`: ONNX Runtime refused this item (`transient` when the device
  ran out of memory: a job is tried again, a call is answered with it);
- `code_error`: the model's own code raised for this item, or gave what its card
  does not declare (the exception's type and message; its traceback is logged);
- `code_time_limit`: a call of the model's code ran past `time_limit_seconds`.

What a caller does with a failure (retry, dead-letter, answer 4xx/5xx) is its own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.cards import ModelCard
from app.errors import UnknownModel
from app.repository.registry import ModelRepository
from app.runtime import code, engine
from app.runtime.sessions import SessionPool

logger = logging.getLogger(__name__)

MODEL_UNAVAILABLE = "model_unavailable"
MODEL_INVALID = "model_invalid"
NON_FINITE_OUTPUT = "non_finite_output"
INFERENCE_ERROR = "inference_error"
CODE_ERROR = "code_error"
CODE_TIME_LIMIT = "code_time_limit"

Arrays = dict[str, np.ndarray]

# Errors worth another attempt: the device (GPU or host) ran out of memory, which
# ORT reports from its allocator ("Failed to allocate memory") or from CUDA.
_TRANSIENT_MARKERS = (
    "failed to allocate memory",
    "out of memory",
    "cudaerrormemoryallocation",
    "cuda failure",
)


@dataclass(frozen=True, slots=True)
class Ran:
    """An item's outputs, and its rows' share of the ONNX Runtime call."""

    outputs: Arrays
    share: float  # its rows over the micro-batch's
    compute_s: float  # that share of the call's time


@dataclass(frozen=True, slots=True)
class Failed:
    """Why an item ended without outputs: its code, the error (its class and
    traceback go to a dead letter), and what a caller is told."""

    code: str
    error: Exception
    transient: bool = False
    message: str | None = None  # default: the error's class and text

    @property
    def detail(self) -> str:
        return self.message or f"{type(self.error).__name__}: {self.error}"


Outcome = Ran | Failed


def transient(exc: Exception) -> bool:
    """The device ran out of memory: another attempt may succeed."""
    return any(marker in str(exc).lower() for marker in _TRANSIENT_MARKERS)


def resolve(repository: ModelRepository, model: str, version: str | None) -> ModelCard | Failed:
    """The card of `model` at `version`, rescanning once for one added since this
    process last looked; a `model_unavailable` failure when it does not serve."""
    try:
        return repository.resolve_rescanning(model, version)
    except UnknownModel as exc:
        return Failed(MODEL_UNAVAILABLE, exc)


def run_card(
    sessions: SessionPool,
    card: ModelCard,
    items: list[Arrays],
    repository: ModelRepository | None = None,
    records: Any = None,
) -> list[Outcome]:
    """Run checked items on `card` (one ONNX Runtime call for many where the card
    batches): one outcome an item, a bad item failing only itself. With the
    `repository`, a version whose file went because it was removed a moment ago
    (its session not made yet here) is `model_unavailable`, not `model_invalid`.
    A pipeline's items run its steps (app.execution.steps; `records` keeps an
    async job's finished steps)."""
    if not items:
        return []
    if card.steps is not None:
        from app.execution import steps  # (it runs each step's model through here)

        return steps.run(sessions, repository, card, items, records)
    try:
        engine.warm(sessions, card)
    except Exception as exc:  # its file is missing, corrupt or unlike its card
        if repository is not None and removed(repository, card):
            return [Failed(MODEL_UNAVAILABLE, exc, message=f"model {card.ref} was removed "
                           "from the repository before it ran")] * len(items)  # fmt: skip
        if not transient(exc):
            logger.error("model %s cannot serve, failing %d item(s): %s", card.ref, len(items), exc)
            unusable = Failed(MODEL_INVALID, exc, message=f"model {card.ref} cannot serve: "
                              f"{type(exc).__name__}: {exc}")  # fmt: skip
            return [unusable] * len(items)
    started = time.perf_counter()
    results = engine.infer(sessions, card, items)
    elapsed = time.perf_counter() - started
    sizes = [_rows(card, item) for item in items]
    total = sum(sizes) or 1
    return [
        _failed(result)
        if isinstance(result, Exception)
        else Ran(result, size / total, elapsed * size / total)
        for result, size in zip(results, sizes, strict=True)
    ]


def removed(repository: ModelRepository, card: ModelCard) -> bool:
    """Whether `card`'s version is gone from the repository (looked at again now)."""
    if card.main_file.exists():
        return False
    repository.sync(force=True)
    return isinstance(resolve(repository, card.name, card.version), Failed)


def run_model(
    repository: ModelRepository, sessions: SessionPool, model: str, version: str,
    items: list[Arrays],
) -> tuple[ModelCard | None, list[Outcome]]:  # fmt: skip
    """`run_card` for a model named by reference (a lane call's): the card it ran
    on (None when it does not serve), and each item's outcome."""
    card = resolve(repository, model, version)
    if isinstance(card, Failed):
        return None, [card] * len(items)
    return card, run_card(sessions, card, items, repository)


def result(outcome: Outcome) -> tuple[Arrays | None, tuple[str, str] | None, float]:
    """What a call's record keeps of an outcome: its outputs, or its failure's code
    and detail; and its compute seconds."""
    if isinstance(outcome, Ran):
        return outcome.outputs, None, outcome.compute_s
    return None, (outcome.code, outcome.detail), 0.0


def _failed(exc: Exception) -> Failed:
    if isinstance(exc, engine.NonFiniteOutput):
        return Failed(NON_FINITE_OUTPUT, exc)
    if isinstance(exc, code.CodeTimeLimit):
        return Failed(CODE_TIME_LIMIT, exc, message=str(exc))
    if isinstance(exc, code.CodeError):  # its message names the function and the exception
        return Failed(CODE_ERROR, exc, message=str(exc))
    return Failed(INFERENCE_ERROR, exc, transient(exc))


def _rows(card: ModelCard, item: Arrays) -> int:
    """Rows the item adds to its micro-batch (1 for a model without a batch axis)."""
    return max(1, engine.rows(item)) if card.batching.max_batch_size > 0 else 1
