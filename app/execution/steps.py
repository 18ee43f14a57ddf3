"""Running a pipeline (a card with `steps`, app.cards.steps) on a micro-batch of
requests: each step's model runs once for every request of the batch that needs
it (a mapped step's elements flattened among them), through the one way a model
runs (`runs.run_card`), so its rows share ONNX Runtime calls with the other
requests' and its code fails one request, not the batch.

With `Records` (an async job's), every finished step, and every finished slice of
a mapped step's elements, is written as it finishes, and steps already written
are read instead of run: a job retried after its worker died resumes at its
first unfinished step, and no finished step runs again. A request that fails
names its step and the step's model; a transient failure (a device out of
memory) leaves the job to be retried from that step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.cards import ModelCard, Step, Steps
from app.cards.steps import CHAT_OUTPUTS
from app.execution import runs
from app.generation import oneshot
from app.generation.requests import GenerationRequest
from app.jobs.steps import WHOLE
from app.observability import tracing
from app.repository.registry import ModelRepository
from app.runtime.code import conform
from app.runtime.datatypes import V2_TO_NUMPY, element
from app.runtime.sessions import SessionPool
from app.runtime.tensors import InvalidInputs

Arrays = dict[str, np.ndarray]
Key = tuple[str, int]  # (step, element): WHOLE for a step that is not mapped
# What a step's own `max_attempts` tries again, alone (a failure of the request's,
# or of the model's code, that may not come again); the model being gone is not.
RETRIED = frozenset({runs.CODE_ERROR, runs.CODE_TIME_LIMIT, runs.INFERENCE_ERROR,
                     runs.NON_FINITE_OUTPUT})  # fmt: skip
RETRY_S, RETRY_MAX_S = 0.05, 1.0  # its backoff: doubled each try, at most this


class Records(Protocol):
    """Where a batch's finished steps are kept: item index -> what each finished."""

    def recorded(self) -> list[dict[Key, Arrays]]: ...

    def record(self, rows: list[tuple[int, str, int, Arrays]]) -> None: ...

    def traces(self) -> list[str | None]: ...


@dataclass
class _Item:
    values: Arrays  # the request's inputs and every finished step's outputs, by source name
    failed: runs.Failed | None = None
    compute_s: float = 0.0


def run(
    sessions: SessionPool, repository: ModelRepository | None, card: ModelCard,
    items: list[Arrays], records: Records | None = None,
) -> list[runs.Outcome]:  # fmt: skip
    """One outcome an item: the pipeline's outputs, or the failure of its step."""
    assert card.steps is not None, f"{card.ref} is not a pipeline"
    state = [_Item(dict(item)) for item in items]
    done = records.recorded() if records is not None else [{} for _ in items]
    traces = records.traces() if records is not None else [None] * len(items)
    for step in card.steps.order:
        live = [i for i, item in enumerate(state) if item.failed is None]
        if not live:
            break
        model = _model(repository, step)
        if isinstance(model, runs.Failed):
            for i in live:
                state[i].failed = _named(step, step.model, model)
            continue
        spans = [tracing.start(f"step {step.name}", traces[i], model=step.model)
                 for i in live if traces[i]]  # fmt: skip
        try:
            _Step(sessions, repository, step, model, records).run(state, done, live)
        finally:
            for span in spans:
                span.end()
    return [_outcome(card, card.steps, item, len(items)) for item in state]


def _model(repository: ModelRepository | None, step: Step) -> ModelCard | runs.Failed:
    if repository is None:
        return runs.Failed(runs.MODEL_UNAVAILABLE, LookupError("no repository to resolve"))
    return runs.resolve(repository, step.model, step.version)


class _Step:
    def __init__(
        self, sessions: SessionPool, repository: ModelRepository | None, step: Step,
        card: ModelCard, records: Records | None,
    ) -> None:  # fmt: skip
        self.sessions, self.repository, self.step, self.card = sessions, repository, step, card
        self.records = records

    def run(self, state: list[_Item], done: list[dict[Key, Arrays]], live: list[int]) -> None:
        step = self.step
        have: dict[tuple[int, int], Arrays] = {}
        todo: list[tuple[int, int, Arrays]] = []
        counts: dict[int, int] = {}
        for i in live:
            values = state[i].values
            if (step.name, WHOLE) in done[i]:
                have[(i, WHOLE)] = done[i][(step.name, WHOLE)]
            elif not _runs(step, values):
                have[(i, WHOLE)] = _empty(self.card)
            elif step.map is None:
                todo.append((i, WHOLE, {k: values[s] for k, s in step.inputs.items()}))
            else:
                counts[i] = len(values[step.map])
                for e in range(counts[i]):
                    if (step.name, e) in done[i]:
                        have[(i, e)] = done[i][(step.name, e)]
                    else:
                        todo.append((i, e, self._element(values, e)))
        for part in self._slices(todo):
            self._run(part, state, have)
        for i in live:
            if state[i].failed is not None:
                continue
            if i in counts:
                outputs = _gathered(self.card, [have[(i, e)] for e in range(counts[i])])
            else:
                outputs = have[(i, WHOLE)]
            state[i].values |= {f"{step.name}.{name}": v for name, v in outputs.items()}

    def _element(self, values: Arrays, e: int) -> Arrays:
        """The request a mapped step makes of element `e`: the mapped source's row,
        the other sources whole."""
        step = self.step
        return {k: values[s][e : e + 1] if s == step.map else values[s]
                for k, s in step.inputs.items()}  # fmt: skip

    def _slices(self, todo: list[tuple[int, int, Arrays]]) -> list[list[tuple[int, int, Arrays]]]:
        """All at once, but a mapped step's elements, recorded slice by slice
        (one ONNX Runtime call's worth: the model's max_batch_size), so a worker
        that dies inside a long map leaves the finished slices recorded."""
        if self.step.map is None or self.records is None:
            return [todo] if todo else []
        size = max(1, self.card.batching.max_batch_size)
        return [todo[k : k + size] for k in range(0, len(todo), size)]

    def _run(self, part: list[tuple[int, int, Arrays]], state: list[_Item],
             have: dict[tuple[int, int], Arrays]) -> None:  # fmt: skip
        live = [(i, e, r) for i, e, r in part if state[i].failed is None]
        outcomes = self._outcomes([r for _, _, r in live])
        for attempt in range(1, self.step.max_attempts):  # the step's own retries
            again = [k for k, o in enumerate(outcomes)
                     if isinstance(o, runs.Failed) and o.code in RETRIED]  # fmt: skip
            if not again:
                break
            time.sleep(min(RETRY_MAX_S, RETRY_S * 2 ** (attempt - 1)))
            for k, outcome in zip(again, self._outcomes([live[k][2] for k in again]),
                                  strict=True):  # fmt: skip
                outcomes[k] = outcome
        rows = []
        for (i, e, _), outcome in zip(live, outcomes, strict=True):
            if isinstance(outcome, runs.Failed):
                state[i].failed = _named(self.step, self.card.ref, outcome)
                continue
            have[(i, e)] = outcome.outputs
            state[i].compute_s += outcome.compute_s
            rows.append((i, self.step.name, e, outcome.outputs))
        if self.records is not None and rows:
            self.records.record(rows)

    def _outcomes(self, requests: list[Arrays]) -> list[runs.Outcome]:
        if self.card.generation is not None:
            return self._generated(requests)
        return runs.run_card(self.sessions, self.card, requests, self.repository)

    def _generated(self, requests: list[Arrays]) -> list[runs.Outcome]:
        """A chat model's step (app.generation.oneshot): one generation, or one
        scoring of the step's labels, a request."""
        wanted: list[GenerationRequest | runs.Failed] = []
        for request in requests:
            try:
                text = _plain(request[oneshot.INPUT].reshape(-1)[0])
                wanted.append(oneshot.request(self.card, str(text), self.step.parameters))
            except (InvalidInputs, KeyError, IndexError) as exc:
                wanted.append(runs.Failed("invalid_input", exc))
        asked = [w for w in wanted if not isinstance(w, runs.Failed)]
        started = time.perf_counter()
        made = iter(oneshot.generate(oneshot.engines(self.sessions), self.card, asked))
        share = (time.perf_counter() - started) / max(1, len(asked))
        outcomes: list[runs.Outcome] = []
        for w in wanted:
            if isinstance(w, runs.Failed):
                outcomes.append(w)
                continue
            got = next(made)
            outcomes.append(runs.Failed(runs.INFERENCE_ERROR, got) if isinstance(got, Exception)
                            else runs.Ran(got, 1 / max(1, len(asked)), share))  # fmt: skip
        return outcomes


def _runs(step: Step, values: Arrays) -> bool:
    """Whether the step's `when` holds: each named source has values, all listed."""
    for source, allowed in step.when.items():
        found = [_plain(v) for v in values[source].reshape(-1).tolist()]
        if not found or any(v not in allowed for v in found):
            return False
    return True


def _plain(value: object) -> object:
    return element(value) if isinstance(value, bytes) else value


def _empty(card: ModelCard) -> Arrays:
    """A step that did not run: each output with no rows."""
    specs = ([(s.name, s.datatype, s.shape) for s in card.outputs] if card.generation is None
             else CHAT_OUTPUTS)  # fmt: skip
    return {name: np.empty((0, *(max(d, 0) for d in shape[1:])), dtype=V2_TO_NUMPY[datatype])
            for name, datatype, shape in specs}  # fmt: skip


def _gathered(card: ModelCard, parts: list[Arrays]) -> Arrays:
    if not parts:
        return _empty(card)
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _named(step: Step, model: str, failed: runs.Failed) -> runs.Failed:
    return runs.Failed(failed.code, failed.error, failed.transient,
                       message=f"step {step.name!r} ({model}): {failed.detail}")  # fmt: skip


def _outcome(card: ModelCard, steps: Steps, item: _Item, size: int) -> runs.Outcome:
    if item.failed is not None:
        return item.failed
    try:
        outputs = {spec.name: conform(spec, item.values[steps.outputs[spec.name]])
                   for spec in card.outputs}  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        return runs.Failed(runs.INFERENCE_ERROR, exc, message=f"the pipeline's outputs: {exc}")
    return runs.Ran(outputs, 1 / size, item.compute_s)
