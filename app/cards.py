"""Model cards: what a model version takes and gives, read from its `card.json`.

The card is the model's contract (inputs, outputs, labels, provenance, held-out
accuracy, batching, the queue its jobs run on, and the pre- and post-processing
around the graph, if any). The API validates submissions against it without
loading ONNX Runtime; workers check on load that the ONNX graph agrees with it
(`app.runtime.sessions.check_card`). Everything here is plain data, read by the
registry above it and the runtime beside it.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# A queue name a card may give: it becomes a Redis key and an item of WORKER_QUEUES.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model serve, as Triton's `version_policy`:
    `{"latest": N}`, `{"specific": ["1", "3"]}`, or `{"all": {}}` (the default)."""

    latest: int | None = None
    specific: tuple[str, ...] | None = None

    def select(self, versions: list[str]) -> list[str]:
        """The serving ones of `versions` (sorted oldest first)."""
        if self.latest is not None:
            return versions[-self.latest :]
        if self.specific is not None:
            return [v for v in versions if v in self.specific]
        return versions

    def to_dict(self) -> dict[str, Any]:
        if self.latest is not None:
            return {"latest": self.latest}
        if self.specific is not None:
            return {"specific": list(self.specific)}
        return {"all": {}}

    @classmethod
    def from_dict(cls, raw: Any) -> VersionPolicy:
        if raw is None or raw == {"all": {}}:
            return cls()
        if isinstance(raw, dict) and set(raw) == {"latest"}:
            latest = raw["latest"]
            if isinstance(latest, int) and not isinstance(latest, bool) and latest >= 1:
                return cls(latest=latest)
        if isinstance(raw, dict) and set(raw) == {"specific"}:
            specific = raw["specific"]
            if isinstance(specific, list) and all(isinstance(v, str | int) for v in specific):
                return cls(specific=tuple(str(v) for v in specific))
        raise ValueError(
            'version_policy: {"latest": N} with N >= 1, {"specific": ["1", ...]} or {"all": {}}'
        )


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe v2 datatype, e.g. FP32
    shape: tuple[int, ...]  # -1 means any size

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TensorSpec:
        return cls(str(raw["name"]), str(raw["datatype"]), tuple(int(d) for d in raw["shape"]))


@dataclass(frozen=True)
class Batching:
    """How a worker batches jobs of this model, like Triton's dynamic batcher.

    With `max_batch_size` > 0 the first dimension of every input and output is
    the batch: jobs are concatenated along it, up to that many rows per ONNX
    Runtime call, after the worker waited up to `max_queue_delay_ms` for more.
    0 runs each job in a call of its own (inputs without a batch dimension).
    """

    max_batch_size: int = 0
    max_queue_delay_ms: float = 0.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Batching:
        size, delay = int(raw.get("max_batch_size", 0)), float(raw.get("max_queue_delay_ms", 0))
        if size < 0 or not 0 <= delay <= 1000:
            raise ValueError("batching: max_batch_size >= 0 and 0 <= max_queue_delay_ms <= 1000")
        return cls(size, delay)


@dataclass(frozen=True)
class PipelineSpec:
    """Pre- and post-processing declared by the card, run around the graph by
    `app.runtime.pipeline`: `pre` steps turn the card's inputs into the graph's
    (`model_inputs`), `post` steps turn its outputs (`model_outputs`) into the
    card's. Each step is `{"step": <name>, ...its parameters}`."""

    pre: tuple[dict[str, Any], ...]
    model_inputs: tuple[TensorSpec, ...]
    model_outputs: tuple[TensorSpec, ...]
    post: tuple[dict[str, Any], ...]
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"why": self.why} if self.why else {}),
            "pre": list(self.pre),
            "model": {
                "inputs": [s.to_dict() for s in self.model_inputs],
                "outputs": [s.to_dict() for s in self.model_outputs],
            },
            "post": list(self.post),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PipelineSpec:
        steps = [*raw.get("pre", []), *raw.get("post", [])]
        if not all(isinstance(step, dict) and isinstance(step.get("step"), str) for step in steps):
            raise ValueError('pipeline: every step is an object with a "step" name')
        return cls(
            pre=tuple(raw.get("pre", [])),
            model_inputs=tuple(TensorSpec.from_dict(s) for s in raw["model"]["inputs"]),
            model_outputs=tuple(TensorSpec.from_dict(s) for s in raw["model"]["outputs"]),
            post=tuple(raw.get("post", [])),
            why=str(raw.get("why", "")),
        )


class TemplateRefused(Exception):
    """A chat template raised (`raise_exception`: roles out of its order, say), or
    went past what one rendering may take (TEMPLATE_SECONDS, TEMPLATE_ITEMS)."""


# A model's template comes from its file (a GGUF from anywhere); one request's
# rendering, on the API's threads and the decode loop, may take this much at most.
TEMPLATE_SECONDS = 0.5
TEMPLATE_ITEMS = 100_000  # a sequence its `*` makes, a number a call takes (as Jinja's ranges)
_DEADLINE: ContextVar[float] = ContextVar("template_deadline", default=float("inf"))


def _refuse(message: str) -> None:
    raise TemplateRefused(message)


def on_time() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise TemplateRefused(f"the chat template ran past {TEMPLATE_SECONDS:g} s")


class TimedList(list[Any]):
    """A list a template iterates under the rendering's deadline (a loop in a loop
    over the messages, with nothing written, would else run unchecked)."""

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            on_time()
            yield item

    def __getitem__(self, index: Any) -> Any:
        got = super().__getitem__(index)
        return TimedList(got) if isinstance(index, slice) else got


@contextmanager
def rendering() -> Iterator[None]:
    """The deadline of one rendering (TEMPLATE_SECONDS from now)."""
    token = _DEADLINE.set(time.monotonic() + TEMPLATE_SECONDS)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def template_environment() -> Any:
    """Jinja's immutable sandbox as Hugging Face renders chat templates in it: no
    access to Python's internals, nothing it is given changed, ranges bounded; and
    bounded here in time (ranges and TimedList checked against `rendering`'s
    deadline) and in size (`*`, `**` and `%` checked, so not folded at compile time:
    a template's `'x' * 10**9` took 23 s and 1 GB to compile; calls' and filters'
    numbers and format widths checked before the call)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _bounded(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(__obj, "__name__", "") in ("format", "format_map"):
                _widths(getattr(getattr(__obj, "__wrapped__", __obj), "__self__", ""))
            _sizes(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    def timed_range(*args: int) -> TimedList:
        return TimedList(safe_range(*args))

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters = {name: _sized_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _refuse
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["range"] = timed_range
    return env


def _sizes(args: Any, kwargs: dict[str, Any]) -> None:
    """TemplateRefused for an integer argument past TEMPLATE_ITEMS: a width, a count
    or a length (`'x'.ljust(10**9)`, `|center(10**9)`) would make a string that long."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > TEMPLATE_ITEMS:
            _refuse(f"the chat template passes {value}, more than {TEMPLATE_ITEMS}, to a call")


def _widths(text: Any) -> None:
    """TemplateRefused for a format string with a width of seven digits or more."""
    if isinstance(text, str) and re.search(r"[0-9]{7,}", text):
        _refuse("the chat template formats with a width of more than six digits")


def _sized_filter(name: str, f: Any) -> Any:
    """A filter whose arguments past the value are bounded as a call's (`format`'s
    value, a format string, too)."""
    at = 1 if getattr(f, "jinja_pass_arg", None) else 0  # (the value's place)

    @functools.wraps(f)
    def sized(*args: Any, **kwargs: Any) -> Any:
        _sizes(args[at + 1 :], kwargs)
        if name == "format" and len(args) > at:
            _widths(args[at])
        return f(*args, **kwargs)

    return sized


def _bounded(operator: str, left: Any, right: Any) -> None:
    """TemplateRefused for a `*` making a sequence longer than TEMPLATE_ITEMS, a `**`
    making an integer of more than a million bits, or a `%` format too wide."""
    if operator == "%" and isinstance(left, str):  # (a format; an integer's modulo is none)
        _widths(left)
        _sizes(right if isinstance(right, tuple) else (right,), {})
    elif operator == "*":
        for items, times in ((left, right), (right, left)):
            if (isinstance(items, str | list | tuple) and isinstance(times, int)
                    and len(items) * times > TEMPLATE_ITEMS):  # fmt: skip
                _refuse(f"the chat template makes a sequence of more than {TEMPLATE_ITEMS} items")
    elif (operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0
          and max(left.bit_length(), 1) * right > 1_000_000):  # fmt: skip
        _refuse("the chat template makes an integer of more than a million bits")


def check_template(source: str) -> None:
    """ValueError when a card's chat template is not a Jinja template."""
    from jinja2 import TemplateError

    try:
        template_environment().from_string(source)
    except TemplateError as exc:
        raise ValueError(f"generation.chat_template does not compile: {exc}") from None


@dataclass(frozen=True)
class GenerationSpec:
    """A generative model's contract (the card's `generation`): its context, the
    ceiling and default of `max_tokens`, the chat roles it knows, and the ids of
    its control tokens (app.generation)."""

    context_length: int
    max_tokens: int
    default_max_tokens: int
    roles: tuple[str, ...]
    default_system: str | None
    special: dict[str, int]
    stop_tokens: tuple[int, ...]
    max_choices: int = 8  # `n` at most (OpenAI's several choices of one request)
    # The model's own Jinja chat template (app.generation.templates), its control
    # tokens' text and ids; without one, chat roles are ChatML's (im_start, im_end).
    chat_template: str | None = None
    control: dict[str, int] = field(default_factory=dict)
    add_bos: bool = False  # a prompt begins with special["bos"] (the file asks for it)

    def to_dict(self) -> dict[str, Any]:
        return {
            "context_length": self.context_length,
            "max_tokens": self.max_tokens,
            "default_max_tokens": self.default_max_tokens,
            "max_choices": self.max_choices,
            "roles": list(self.roles),
            "parameters": [
                "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                "logprobs", "top_logprobs", "response_format", "labels",
            ],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GenerationSpec:
        spec = cls(
            context_length=int(raw["context_length"]),
            max_tokens=int(raw["max_tokens"]),
            default_max_tokens=int(raw.get("default_max_tokens", raw["max_tokens"])),
            roles=tuple(raw.get("roles", ("system", "user", "assistant"))),
            default_system=raw.get("default_system"),
            special={str(k): int(v) for k, v in raw["special"].items()},
            stop_tokens=tuple(int(t) for t in raw["stop_tokens"]),
            max_choices=int(raw.get("max_choices", 8)),
            chat_template=raw.get("chat_template"),
            control={str(k): int(v) for k, v in raw.get("control", {}).items()},
            add_bos=bool(raw.get("add_bos", False)),
        )
        if not 0 < spec.default_max_tokens <= spec.max_tokens < spec.context_length:
            raise ValueError("generation: 0 < default_max_tokens <= max_tokens < context_length")
        if not 1 <= spec.max_choices <= 64:
            raise ValueError("generation.max_choices: from 1 to 64")
        if spec.chat_template is not None:
            check_template(spec.chat_template)
        elif spec.roles and not {"im_start", "im_end"} <= spec.special.keys():
            raise ValueError("generation.special: the ids of im_start and im_end (its chat "
                             "roles are ChatML's without a chat_template)")  # fmt: skip
        if spec.add_bos and "bos" not in spec.special:
            raise ValueError("generation.add_bos: special must name the bos id")
        return spec


@dataclass(frozen=True)
class ModelCard:
    name: str
    version: str
    path: Path  # the version directory
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    platform: str = "onnxruntime_onnx"
    description: str = ""
    labels: tuple[str, ...] = ()
    batching: Batching = field(default_factory=Batching)
    pipeline: PipelineSpec | None = None  # None: clients' tensors go to the graph as they are
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    tenants: tuple[str, ...] | None = None  # None: every tenant may use it
    # The Celery queue its jobs' wake-ups travel on ("gpu", "cpu"): only workers that
    # serve it run the model. None: DEFAULT_MODEL_QUEUE. The newest card speaks for
    # the model (jobs are claimed by model, whatever their version).
    queue: str | None = None
    # A generative model's (app.generation); None for one-shot models.
    generation: GenerationSpec | None = None
    # Triton's model configuration `parameters` (name to string value): kept with
    # the model and shown in its configuration; the runtime reads none of them.
    parameters: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def onnx_path(self) -> Path:
        return self.path / "model.onnx"

    @property
    def cuda_onnx_path(self) -> Path:
        """The graph the CUDA provider loads where one was built (`models build --cuda`)."""
        return self.path / "model.cuda.onnx"

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    def visible_to(self, tenant: str | None) -> bool:
        return tenant is None or self.tenants is None or tenant in self.tenants

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "platform": self.platform,
            "description": self.description,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "labels": list(self.labels),
            "batching": {
                "max_batch_size": self.batching.max_batch_size,
                "max_queue_delay_ms": self.batching.max_queue_delay_ms,
            },
            **({"pipeline": self.pipeline.to_dict()} if self.pipeline else {}),
            "version_policy": self.version_policy.to_dict(),
            **({"queue": self.queue} if self.queue else {}),
            **({"generation": self.generation.to_dict()} if self.generation else {}),
            **({"parameters": dict(self.parameters)} if self.parameters else {}),
            **self.extra,
        }

    @classmethod
    def load(cls, version_dir: Path) -> ModelCard:
        raw = json.loads((version_dir / "card.json").read_text())
        known = {"name", "version", "platform", "description", "inputs", "outputs", "labels",
                 "batching", "pipeline", "version_policy", "tenants", "queue",
                 "generation", "parameters"}  # fmt: skip
        tenants = raw.get("tenants")
        if tenants is not None and not (
            isinstance(tenants, list) and all(isinstance(t, str) for t in tenants)
        ):
            raise ValueError('tenants: a list of tenant names, e.g. ["acme"]')
        queue = raw.get("queue")
        if queue is not None and not (isinstance(queue, str) and QUEUE_NAME.fullmatch(queue)):
            raise ValueError('queue: a queue name of [A-Za-z0-9_.-], at most 64, e.g. "gpu"')
        parameters = raw.get("parameters", {})
        if not (
            isinstance(parameters, dict) and all(isinstance(v, str) for v in parameters.values())
        ):
            raise ValueError('parameters: names to string values, e.g. {"note": "v2"}')
        return cls(
            name=version_dir.parent.name,
            version=version_dir.name,
            path=version_dir,
            inputs=tuple(TensorSpec.from_dict(s) for s in raw["inputs"]),
            outputs=tuple(TensorSpec.from_dict(s) for s in raw["outputs"]),
            platform=raw.get("platform", "onnxruntime_onnx"),
            description=raw.get("description", ""),
            labels=tuple(raw.get("labels", ())),
            batching=Batching.from_dict(raw.get("batching", {})),
            pipeline=PipelineSpec.from_dict(raw["pipeline"]) if "pipeline" in raw else None,
            version_policy=VersionPolicy.from_dict(raw.get("version_policy")),
            tenants=tuple(tenants) if tenants is not None else None,
            queue=queue,
            generation=GenerationSpec.from_dict(raw["generation"]) if "generation" in raw else None,
            parameters=dict(parameters),
            extra={k: v for k, v in raw.items() if k not in known},
        )


def version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)
