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
from app.runtime import code, pipeline
from app.runtime.datatypes import is_float
from app.runtime.sessions import SessionPool

Arrays = dict[str, np.ndarray]
# A request's outputs, or the exception that ended it (the caller decides retry or fail).
Result = Arrays | Exception


class NonFiniteOutput(ValueError):
    """The model produced NaN or infinity for this request."""


def infer(sessions: SessionPool, card: ModelCard, requests: list[Arrays]) -> list[Result]:
    if card.code:  # the model's own code around its graph (app.runtime.code)
        graph = _Graph(sessions, card) if card.onnx_path.is_file() else None
        results = code.infer(card, requests, graph)
        return [r if isinstance(r, Exception) else _checked(card, r) for r in results]
    return _Graph(sessions, card, checked=True)(requests)


class _Graph:
    """A card's graph over a micro-batch: `pipeline.run` on the card's inputs, or
    for a model with code, the graph alone on the inputs its preprocess made."""

    def __init__(self, sessions: SessionPool, card: ModelCard, checked: bool = False) -> None:
        self.sessions, self.card, self.checked = sessions, card, checked
        self.names: list[str] | None = None
        self.outputs: list[str] | None = None
        if card.code:
            session = sessions.get(card)
            self.names = [node.name for node in session.get_inputs()]
            self.outputs = [node.name for node in session.get_outputs()]

    def __call__(self, requests: list[Arrays]) -> list[Result]:
        names = self.names or [spec.name for spec in self.card.inputs]
        results: list[Result | None] = [None] * len(requests)
        feeds: dict[int, Arrays] = {}
        for i, request in enumerate(requests):
            if all(name in request for name in names):
                feeds[i] = {name: request[name] for name in names}
            else:  # (a model's preprocess that gave less than its graph takes)
                results[i] = ValueError(f"the graph of {self.card.ref} takes {names}; "
                                        f"preprocess gave {sorted(request)}")  # fmt: skip
        order = list(feeds)
        for chunk in _chunks(self.card, [feeds[i] for i in order]):
            members = [order[c] for c in chunk]
            if len(members) == 1:
                results[members[0]] = self._alone(feeds[members[0]])
                continue
            try:
                parts = self._together([feeds[i] for i in members])
            # ORT raises its own exception types; each request is then tried alone,
            # and whatever it raises there becomes that request's result.
            except Exception:
                parts = [self._alone(feeds[i]) for i in members]
            for i, part in zip(members, parts, strict=True):
                results[i] = part
        return [r if r is not None else RuntimeError("request was not run") for r in results]

    def _run(self, inputs: Arrays) -> Arrays:
        if self.names is None:
            return _timed(self.sessions, self.card, inputs)
        return _timed(self.sessions, self.card, inputs, self.outputs)

    def _together(self, requests: list[Arrays]) -> list[Result]:
        merged = {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}
        outputs = self._run(merged)
        counts = [rows(r) for r in requests]
        total = sum(counts)
        if any(array.shape[:1] != (total,) for array in outputs.values()):
            raise ValueError(f"{self.card.ref}: an output has no batch dimension; run alone")
        ends = np.cumsum(counts)
        parts = [{name: array[end - n : end] for name, array in outputs.items()}
                 for n, end in zip(counts, ends, strict=True)]  # fmt: skip
        return [_checked(self.card, p) if self.checked else p for p in parts]

    def _alone(self, request: Arrays) -> Result:
        try:
            outputs = self._run(request)
            return _checked(self.card, outputs) if self.checked else outputs
        except Exception as exc:  # recorded as this request's result, never swallowed
            return exc


def warm(sessions: SessionPool, card: ModelCard) -> None:
    """Load what running `card` needs in this process (its session, its tokenizer,
    its code), so a version that cannot serve fails here, before its items run."""
    if card.code:
        code.CODE.get(card)
    if card.graph:
        sessions.get(card)
        pipeline.load(card)


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


def _timed(
    sessions: SessionPool, card: ModelCard, inputs: Arrays, names: list[str] | None = None
) -> Arrays:
    """One inference call, observed once (its latency and rows), not per request:
    the card's pipeline around its graph, or with `names`, the graph alone."""
    started = time.perf_counter()
    outputs = (
        pipeline.run(sessions, card, inputs) if names is None else sessions.run(card, inputs, names)
    )
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
