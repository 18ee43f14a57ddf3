"""A chat model as a pipeline's step: each request's text, as the user's message
(after the step's `system` message, if any), generated to the end or scored
against the step's `labels`, in the worker that runs the pipeline, batched in one
decode engine (app.runtime.decode), with no job of its own.

A step's outputs: `text_output` (the text made, or the most likely label), and
for a scored step also `label` (that label) and `scores` (each label's
probability, in the labels' order). Sampling is the step's (`max_tokens`,
`temperature`, ... as the chat door takes them); greedy by default, so a step
gives what the chat doors give for the same messages at temperature 0.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.cards import ModelCard
from app.cards.steps import CHAT_FIELDS
from app.generation.chat import TextStream
from app.generation.formats import chat_format
from app.generation.requests import GenerationRequest, parse
from app.runtime.engines import EnginePool
from app.runtime.labels import LabelScores
from app.runtime.sequences import Sequence
from app.runtime.sessions import SessionPool

Arrays = dict[str, np.ndarray]
INPUT = "text_input"

SLOTS, PREFILL_TOKENS = 16, 256  # a step's engine: sequences together, prompt tokens a call

_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()
# A process's engines for steps, one pool per session pool (the runner's, the lane's).
_pools: weakref.WeakKeyDictionary[SessionPool, EnginePool] = weakref.WeakKeyDictionary()


def engines(sessions: SessionPool) -> EnginePool:
    """The step engines beside `sessions` (a process's runner's): sessions of their
    own on the same provider and device, with every core's threads, as the decode
    loop's (so a step gives what the chat doors give)."""
    with _guard:
        pool = _pools.get(sessions)
        if pool is None:
            own = SessionPool(sessions.provider, 0, sessions.device_id)
            pool = _pools[sessions] = EnginePool(own, SLOTS, PREFILL_TOKENS, prefill_rows=0)
        return pool


def retain(serving: set[str]) -> None:
    """Close the step engines of versions that stopped serving (the repository's hook)."""
    with _guard:
        pools = list(_pools.values())
    for pool in pools:
        pool.retain(serving)


def request(card: ModelCard, text: str, parameters: Mapping[str, Any]) -> GenerationRequest:
    """The request a step makes of one text (InvalidInputs naming what is wrong)."""
    assert card.generation is not None
    sampling = {k: v for k, v in parameters.items() if k not in CHAT_FIELDS}
    sampling.setdefault("temperature", 0)
    system = parameters.get("system")
    messages = ([{"role": "system", "content": str(system)}] if system else []) + [
        {"role": "user", "content": text}]  # fmt: skip
    return parse(card.generation, {"messages": messages}, sampling)


def generate(pool: EnginePool, card: ModelCard, requests: list[GenerationRequest]) -> list[Any]:
    """One outcome a request, in order: its outputs, or the exception that ended it."""
    fmt = chat_format(card)
    results: list[Any] = [None] * len(requests)
    with _lock(card.ref), pool.running(card) as engine:
        pending = deque(enumerate(requests))
        live: dict[Any, tuple[int, Sequence, TextStream, GenerationRequest]] = {}
        while pending or live:
            while pending and engine.room() > 0:
                index, wanted = pending.popleft()
                try:
                    prompt, labels = fmt.prompt_of(wanted), fmt.label_ids(wanted)
                    sequence = Sequence(uuid.uuid4(), prompt, wanted.sampling, fmt.guide(wanted))
                    if labels is not None:
                        sequence.scores = LabelScores(labels)
                    engine.add(sequence)
                except (ValueError, KeyError, TypeError) as exc:
                    results[index] = exc
                    continue
                live[sequence.key] = (index, sequence, fmt.text_stream(wanted.sampling.stop),
                                      wanted)  # fmt: skip
            if not live:
                break
            for emitted in engine.step():
                index, sequence, text, wanted = live[emitted.sequence.key]
                stopped = emitted.token is not None and text.add(emitted.token).stopped
                if stopped and emitted.finished is None:
                    engine.cancel(sequence.key)
                if emitted.finished is not None or stopped:
                    text.finish()
                    results[index] = _outputs(sequence, text, wanted)
                    del live[sequence.key]
    return results


def _outputs(sequence: Sequence, text: TextStream, wanted: GenerationRequest) -> Arrays:
    if sequence.scores is None or wanted.labels is None:
        return {"text_output": np.array([text.text], dtype=object)}
    scores = sequence.scores.probabilities()
    best = wanted.labels[int(np.argmax(scores))]
    return {
        "text_output": np.array([best], dtype=object),
        "label": np.array([best], dtype=object),
        "scores": np.array(scores, dtype=np.float32),
    }


def _lock(ref: str) -> threading.Lock:
    """One generation at a time on a version's engine in this process (the lane's
    threads and the task's may run pipelines at once)."""
    with _guard:
        return _locks.setdefault(ref, threading.Lock())
