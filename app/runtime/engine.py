"""The one inference function every door calls: a model's card and a list of
requests (each a dict of input arrays, checked at submit) in, one result per
request out, in order.

Requests that can share an ONNX Runtime call (the card allows batching and
their non-batch dimensions agree) are concatenated along the first axis, up to
the card's `max_batch_size` rows, run once and split back by row counts, so a
request's rows never reach another request's result. A call that raises is
run again one request at a time, so a bad request fails only itself. Outputs
that are not finite fail their own request with `NonFiniteOutput`: they cannot
be stored as JSON, and they must not take the requests beside them down.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from app.cards import ModelCard
from app.observability import metrics
from app.runtime import pipeline
from app.runtime.datatypes import is_float
from app.runtime.sessions import SessionPool

Arrays = dict[str, np.ndarray]
# A request's outputs, or the exception that ended it (the caller decides retry or fail).
Result = Arrays | Exception


class NonFiniteOutput(ValueError):
    """The model produced NaN or infinity for this request."""


def infer(sessions: SessionPool, card: ModelCard, requests: list[Arrays]) -> list[Result]:
    results: list[Result | None] = [None] * len(requests)
    for chunk in _chunks(card, requests):
        if len(chunk) == 1:
            results[chunk[0]] = _run_alone(sessions, card, requests[chunk[0]])
            continue
        try:
            parts = _run_together(sessions, card, [requests[i] for i in chunk])
        # ORT raises its own exception types; each request is then tried alone,
        # and whatever it raises there becomes that request's result.
        except Exception:
            parts = [_run_alone(sessions, card, requests[i]) for i in chunk]
        for i, part in zip(chunk, parts, strict=True):
            results[i] = part
    return [r if r is not None else RuntimeError("request was not run") for r in results]


def rows(request: Arrays) -> int:
    return int(next(iter(request.values())).shape[0]) if request else 0


def _chunks(card: ModelCard, requests: list[Arrays]) -> list[list[int]]:
    """Indices of requests to run together: same non-batch shapes, at most
    `max_batch_size` rows; a request bigger than that runs alone."""
    limit = card.batching.max_batch_size
    if limit <= 0:
        return [[i] for i in range(len(requests))]
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, request in enumerate(requests):
        key = tuple((name, array.shape[1:]) for name, array in sorted(request.items()))
        groups[key].append(i)
    chunks: list[list[int]] = []
    for members in groups.values():
        chunk: list[int] = []
        size = 0
        for i in members:
            n = rows(requests[i])
            if chunk and size + n > limit:
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(i)
            size += n
        chunks.append(chunk)
    return chunks


def _run_together(sessions: SessionPool, card: ModelCard, requests: list[Arrays]) -> list[Result]:
    merged = {spec.name: np.concatenate([r[spec.name] for r in requests]) for spec in card.inputs}
    outputs = _timed(sessions, card, merged)
    counts = [rows(r) for r in requests]
    total = sum(counts)
    if any(array.shape[:1] != (total,) for array in outputs.values()):
        raise ValueError(f"{card.ref}: an output has no batch dimension; run requests alone")
    ends = np.cumsum(counts)
    return [
        _checked(card, {name: array[end - n : end] for name, array in outputs.items()})
        for n, end in zip(counts, ends, strict=True)
    ]


def _run_alone(sessions: SessionPool, card: ModelCard, request: Arrays) -> Result:
    try:
        return _checked(card, _timed(sessions, card, request))
    except Exception as exc:  # recorded as this request's result, never swallowed
        return exc


def _timed(sessions: SessionPool, card: ModelCard, inputs: Arrays) -> Arrays:
    """One inference call, observed once (its latency and rows), not per request."""
    started = time.perf_counter()
    outputs = pipeline.run(sessions, card, inputs)
    metrics.ORT_SECONDS.labels(card.name).observe(time.perf_counter() - started)
    metrics.ORT_ROWS.labels(card.name).observe(rows(inputs))
    return outputs


def _checked(card: ModelCard, outputs: Arrays) -> Result:
    for spec in card.outputs:
        array = outputs[spec.name]
        if is_float(spec.datatype) and not np.isfinite(array).all():
            return NonFiniteOutput(
                f"output {spec.name!r} of {card.ref} contains NaN or infinity; "
                "the inputs are probably out of the range the model was trained on"
            )
    return outputs
