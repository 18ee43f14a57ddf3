"""A generation request as every door takes it, checked against the model's card.

`{"messages": [{"role", "content"}, ...]}` or `{"prompt": "..."}` as the inputs,
and the parameters beside them: sampling (`max_tokens`, `temperature`, `top_p`,
`top_k`, `seed`, `stop`, the penalties, `logit_bias`), what comes back with each
token (`logprobs`, `top_logprobs`) and what the output must be
(`response_format`, app.generation.guides), each declared once in
app.cards.parameters: a number or an integer is checked by its declaration, the
others by their own functions here. Every problem is named per field, as the
tensor inputs' checks name theirs (app.runtime.tensors.InvalidInputs), so a door
maps them to its own error shape; nothing here knows a door.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import orjson

from app.cards import GenerationSpec
from app.cards.parameters import NAMES, PARAMETERS
from app.generation.guides import Constraint, response_format
from app.runtime.sampling import Sampling
from app.runtime.tensors import InvalidInputs, unpack

MAX_STOP = 4  # stop sequences per request, as OpenAI allows
MAX_STOP_CHARS = 64
MAX_TOP_LOGPROBS = 20  # as OpenAI allows
MAX_LOGIT_BIAS = 300  # tokens, as OpenAI allows
REQUEST_INPUT = "generation_request"  # the stored request: one BYTES value of JSON
MAX_LABELS = 64  # candidate labels one request scores
MAX_LABEL_CHARS = 200


@dataclass(frozen=True)
class GenerationRequest:
    messages: tuple[tuple[str, str], ...] | None
    prompt: str | None
    sampling: Sampling
    constraint: Constraint | None = None
    labels: tuple[str, ...] | None = None  # score these instead of generating
    # The prompt's token ids, as the API measured them against the context with the
    # version's own tokenizer: the worker's loop starts from them instead of
    # tokenizing the prompt again (None: a request stored without them).
    prompt_ids: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The job's stored inputs (and what `from_json` reads back in the worker)."""
        sampling = {k: v for k, v in asdict(self.sampling).items() if v is not None}
        sampling["stop"] = list(self.sampling.stop)
        sampling["logit_bias"] = [list(pair) for pair in self.sampling.logit_bias]
        if self.constraint is not None:
            sampling["constraint"] = self.constraint.to_json()
        if self.labels is not None:
            sampling["labels"] = list(self.labels)
        source: dict[str, Any] = (
            {"messages": [{"role": r, "content": c} for r, c in self.messages]}
            if self.messages is not None
            else {"prompt": self.prompt}
        )
        stored = {**source, "parameters": sampling}
        if self.prompt_ids is not None:
            stored["prompt_ids"] = list(self.prompt_ids)
        return stored

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GenerationRequest:
        params = dict(raw["parameters"])
        params["stop"] = tuple(params.get("stop", ()))
        params["logit_bias"] = tuple((int(t), float(b)) for t, b in params.get("logit_bias", ()))
        constraint = params.pop("constraint", None)
        labels = params.pop("labels", None)
        messages = raw.get("messages")
        return cls(
            messages=tuple((m["role"], m["content"]) for m in messages) if messages else None,
            prompt=raw.get("prompt"),
            sampling=Sampling(**params),
            constraint=Constraint.from_json(constraint) if constraint else None,
            labels=tuple(labels) if labels is not None else None,
            prompt_ids=tuple(raw["prompt_ids"]) if raw.get("prompt_ids") is not None else None,
        )


def parse(spec: GenerationSpec, inputs: Any, parameters: Any) -> GenerationRequest:
    """The request, or InvalidInputs naming each bad field and what was expected.
    The prompt's length against the context is checked once it is tokenized
    (app.generation.chat.ChatFormat.encode)."""
    errors: dict[str, str] = {}
    messages, prompt = _source(spec, inputs, errors)
    if isinstance(parameters, dict):
        parameters = _objects(parameters, errors)
    sampling = _sampling(spec, parameters, errors)
    constraint = None
    if sampling is not None and isinstance(parameters, dict):
        try:
            constraint = response_format(parameters.get("response_format"))
        except InvalidInputs as exc:
            errors |= exc.errors
    labels = _labels(parameters.get("labels") if isinstance(parameters, dict) else None, errors)
    if labels is not None and constraint is not None:
        errors["labels"] = "labels are scored, not generated: leave out response_format"
    if errors or sampling is None:
        raise InvalidInputs(errors)
    return GenerationRequest(messages, prompt, sampling, constraint, labels)


def _labels(raw: Any, errors: dict[str, str]) -> tuple[str, ...] | None:
    """Candidate labels to score: 1 to MAX_LABELS different non-empty strings."""
    if raw is None:
        return None
    expected = (f"a list of 1 to {MAX_LABELS} different non-empty strings of at most "
                f"{MAX_LABEL_CHARS} characters")  # fmt: skip
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_LABELS:
        errors["labels"] = f"expected {expected}"
        return None
    for i, label in enumerate(raw):
        if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL_CHARS:
            errors[f"labels[{i}]"] = f"expected a non-empty string; labels are {expected}"
            return None
        if label in raw[:i]:
            errors[f"labels[{i}]"] = f"{label!r} is labels[{raw.index(label)}] too; {expected}"
            return None
    return tuple(raw)


def parse_row(spec: GenerationSpec, row: Any) -> GenerationRequest:
    """A batch's row: a job's body without the model (`{"inputs": {...},
    "parameters": {...}}`), or the inputs themselves with `parameters` beside them
    (`{"prompt": "...", "parameters": {...}}`)."""
    expected = 'an object {"inputs": {"messages" or "prompt"}, "parameters": {...}}'
    if not isinstance(row, dict):
        raise InvalidInputs({"row": f"expected {expected}"})
    if "inputs" in row:
        if extra := sorted(set(row) - {"inputs", "parameters"}):
            raise InvalidInputs({"row": f"unknown field(s) {extra}; expected {expected}"})
        return parse(spec, row["inputs"], row.get("parameters"))
    inputs = {key: value for key, value in row.items() if key != "parameters"}
    return parse(spec, inputs, row.get("parameters"))


def _source(
    spec: GenerationSpec, inputs: Any, errors: dict[str, str]
) -> tuple[tuple[tuple[str, str], ...] | None, str | None]:
    expected = 'an object with "messages" (a list of {"role", "content"}) or "prompt" (a string)'
    if not isinstance(inputs, dict):
        errors["inputs"] = f"expected {expected}"
        return None, None
    unknown = sorted(set(inputs) - {"messages", "prompt"})
    if unknown:
        errors["inputs"] = f"unknown field(s) {unknown}; expected {expected}"
    if ("messages" in inputs) == ("prompt" in inputs):
        errors.setdefault("inputs", f"give exactly one of messages and prompt: {expected}")
        return None, None
    if "prompt" in inputs:
        prompt = inputs["prompt"]
        if not isinstance(prompt, str) or not prompt:
            errors["prompt"] = "expected a non-empty string"
            return None, None
        return None, prompt
    raw = inputs["messages"]
    if not spec.roles:  # (a GGUF model with no chat template)
        errors["messages"] = "this model takes a prompt to continue, not chat messages"
        return None, None
    if not isinstance(raw, list) or not raw:
        errors["messages"] = 'expected a non-empty list of {"role", "content"} objects'
        return None, None
    messages = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not {"role", "content"} <= message.keys():
            errors[where] = 'expected an object {"role": ..., "content": "..."}'
            continue
        role, content = message["role"], message["content"]
        if extra := sorted(set(message) - {"role", "content", "name"}):
            errors[where] = f"unknown field(s) {extra}; expected role and content"
        if role not in spec.roles:
            errors[f"{where}.role"] = f"unknown role {role!r}; expected one of {list(spec.roles)}"
        if not isinstance(content, str):
            errors[f"{where}.content"] = "expected a string"
            continue
        messages.append((str(role), content))
    return tuple(messages), None


def _sampling(spec: GenerationSpec, raw: Any, errors: dict[str, str]) -> Sampling | None:
    """The declared parameters of Sampling's fields, checked in their order."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors["parameters"] = f"expected an object with any of {list(NAMES)}"
        return None
    if unknown := sorted(set(raw) - set(NAMES)):
        errors["parameters"] = f"unknown parameter(s) {unknown}; known: {list(NAMES)}"
    values: dict[str, Any] = {}
    for parameter in PARAMETERS:
        if not parameter.sampling:
            continue
        if parameter.kind == "own":
            values[parameter.name] = _OWN[parameter.name](raw, errors)
            continue
        if parameter.card_limits:
            parameter = parameter.bounded(spec.default_max_tokens, spec.max_tokens)
        values[parameter.name] = parameter.read(raw.get(parameter.name), errors)
    if errors:
        return None
    return Sampling(**values)


def _stop(raw: dict[str, Any], errors: dict[str, str]) -> tuple[str, ...]:
    stop = raw.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(
        isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop
    ):
        errors["stop"] = (
            f"expected a string or a list of strings of 1 to {MAX_STOP_CHARS} characters"
        )
        return ()
    if len(stop) > MAX_STOP:
        errors["stop"] = f"expected at most {MAX_STOP} stop sequences, got {len(stop)}"
    return tuple(stop)


def _objects(raw: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    """An object or list parameter (`response_format`, `logit_bias`, `labels`) may come
    as its JSON in a string: the form a door of scalar parameters (gRPC's
    InferParameter, Triton's) can carry."""
    decoded = dict(raw)
    for parameter in PARAMETERS:
        if parameter.json and isinstance(value := raw.get(parameter.name), str):
            try:
                decoded[parameter.name] = orjson.loads(value)
            except orjson.JSONDecodeError:
                errors[parameter.name] = f"expected {parameter.json}, or its JSON in a string"
    return decoded


def _logit_bias(given: dict[str, Any], errors: dict[str, str]) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: token ids (as strings or numbers) to -100..100. That
    the ids are in the model's vocabulary is checked with its tokenizer
    (app.generation.chat.ChatFormat.encode)."""
    raw = given.get("logit_bias")
    if raw is None:
        return ()
    expected = f"an object of at most {MAX_LOGIT_BIAS} token ids to numbers from -100 to 100"
    if not isinstance(raw, dict) or len(raw) > MAX_LOGIT_BIAS:
        errors["logit_bias"] = f"expected {expected}"
        return ()
    pairs = []
    for token, bias in raw.items():
        text = str(token)
        good_bias = isinstance(bias, int | float) and not isinstance(bias, bool)
        if not text.isdigit() or not good_bias or not -100 <= bias <= 100:
            errors["logit_bias"] = f"expected {expected}; got {token!r}: {bias!r}"
            return ()
        pairs.append((int(text), float(bias)))
    return tuple(sorted(pairs))


def _logprobs(raw: dict[str, Any], errors: dict[str, str]) -> int | None:
    """How many alternatives each token's log-probability comes with; None: none asked."""
    wanted, top = raw.get("logprobs"), raw.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        errors["logprobs"] = "expected true or false"
        return None
    if top is not None and (not _integer(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        errors["top_logprobs"] = f"expected an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}"
        return None
    if top is not None and not wanted:
        errors["top_logprobs"] = "needs logprobs: true"
        return None
    return int(top or 0) if wanted else None


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The checks of the parameters of their own shape that make Sampling's fields
# (`top_logprobs` is read with `logprobs`; `response_format` and `labels` by parse).
_OWN: dict[str, Callable[[dict[str, Any], dict[str, str]], Any]] = {
    "stop": _stop, "logit_bias": _logit_bias, "logprobs": _logprobs,
}  # fmt: skip


def request_arrays(*requests: GenerationRequest) -> dict[str, np.ndarray]:
    """How generation requests are stored (packed like any inputs): a row each, a
    job's one, or a batch's rows until they are cut into chunk jobs."""
    rows = [orjson.dumps(request.to_json()).decode() for request in requests]
    return {REQUEST_INPUT: np.array(rows, dtype=object)}


def stored_request(input_data: bytes) -> GenerationRequest:
    return GenerationRequest.from_json(orjson.loads(unpack(input_data)[REQUEST_INPUT][0]))
