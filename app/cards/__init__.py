"""Model cards: what a model version takes and gives, read from its `card.json`.

The card is the model's contract (inputs, outputs, labels, provenance, held-out
accuracy, batching, the queue its jobs run on, and the pre- and post-processing
around the graph, if any). The API validates submissions against it without
loading ONNX Runtime; workers check on load that the ONNX graph agrees with it
(`app.runtime.sessions.check_card`). Everything here is plain data, read by the
registry above it and the runtime beside it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.cards.parameters import NAMES as PARAMETER_NAMES
from app.cards.sandbox import (
    TEMPLATE_ITEMS,
    TEMPLATE_SECONDS,
    TemplateRefused,
    TimedList,
    check_template,
    on_time,
    rendering,
    template_environment,
)
from app.cards.steps import ENSEMBLE, Step, Steps
from app.cards.steps import parse as parse_steps

__all__ = [
    "ENSEMBLE",
    "TEMPLATE_ITEMS",
    "TEMPLATE_SECONDS",
    "Batching",
    "GenerationSpec",
    "ModelCard",
    "PipelineSpec",
    "Step",
    "Steps",
    "TemplateRefused",
    "TensorSpec",
    "TimedList",
    "VersionPolicy",
    "check_template",
    "on_time",
    "rendering",
    "template_environment",
    "version_key",
]  # fmt: skip

# A queue name a card may give: it becomes a Redis key and an item of WORKER_QUEUES.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# How long one call of a model's own code may take, unless its card says
# (`time_limit_seconds`): past it the call is ended and its requests fail.
CODE_TIME_LIMIT_S = 30.0


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
            "parameters": list(PARAMETER_NAMES),
        }

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
    # The model's own code (`model.py` in its folder, app.runtime.code) and whether
    # it has a graph (a model may be code alone); a code call's time limit.
    code: bool = False
    graph: bool = True
    time_limit_s: float = CODE_TIME_LIMIT_S
    # A pipeline's steps (app.cards.steps): a model made of other models.
    steps: Steps | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def onnx_path(self) -> Path:
        return self.path / "model.onnx"

    @property
    def code_path(self) -> Path:
        return self.path / "model.py"

    @property
    def backend(self) -> str:
        """Triton's `backend`: python for a model with its own code, none for a
        pipeline (an ensemble), else onnxruntime."""
        return "" if self.steps is not None else "python" if self.code else "onnxruntime"

    @property
    def main_file(self) -> Path:
        """The file without which the version cannot serve: its graph, its code, or
        (a pipeline's) its card."""
        if self.steps is not None:
            return self.path / "card.json"
        return self.onnx_path if self.graph else self.code_path

    @property
    def cuda_onnx_path(self) -> Path:
        """The graph the CUDA provider loads where one was built (`models build --cuda`)."""
        return self.path / "model.cuda.onnx"

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    def visible_to(self, tenant: str | None) -> bool:
        return tenant is None or self.tenants is None or tenant in self.tenants

    @property
    def text_inputs(self) -> frozenset[str]:
        """The BYTES inputs that must be UTF-8 text (a `tokenize` step reads them);
        others may hold any bytes."""
        steps = self.pipeline.pre if self.pipeline else ()
        return frozenset(str(s.get("input")) for s in steps if s.get("step") == "tokenize")

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "platform": self.platform,
            "description": self.description,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [
                {**s.to_dict(), **({"from": self.steps.outputs[s.name]} if self.steps else {})}
                for s in self.outputs
            ],
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
            **({"time_limit_seconds": self.time_limit_s} if self.code else {}),
            **({"steps": self.steps.to_dict()} if self.steps else {}),
            **self.extra,
        }

    @classmethod
    def load(cls, version_dir: Path) -> ModelCard:
        raw = json.loads((version_dir / "card.json").read_text())
        known = {"name", "version", "platform", "description", "inputs", "outputs", "labels",
                 "batching", "pipeline", "version_policy", "tenants", "queue",
                 "generation", "parameters", "time_limit_seconds", "steps"}  # fmt: skip
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
        code = (version_dir / "model.py").is_file()
        limit = raw.get("time_limit_seconds", CODE_TIME_LIMIT_S)
        if isinstance(limit, bool) or not (isinstance(limit, int | float) and 0 < limit <= 3600):
            raise ValueError("time_limit_seconds: a number of seconds from 0 to 3600, e.g. 10")
        if code and raw.get("execution") == "inline":
            raise ValueError('execution: "inline" runs in the API process, where a model\'s own '
                             'code never runs; leave it out (its calls go to workers)')  # fmt: skip
        steps = None
        if "steps" in raw or raw.get("platform") == ENSEMBLE:
            steps = parse_steps(raw, [str(s["name"]) for s in raw["inputs"]], raw["outputs"])
            if code or "generation" in raw or raw.get("execution") == "inline":
                raise ValueError("a pipeline (steps) has no model.py, generation nor inline "
                                 "execution of its own: its steps' models do")  # fmt: skip
        if code and "generation" in raw:
            raise ValueError("model.py: a generative model's code is not supported; "
                             "use a pipeline step around it")  # fmt: skip
        return cls(
            name=version_dir.parent.name,
            version=version_dir.name,
            path=version_dir,
            inputs=tuple(TensorSpec.from_dict(s) for s in raw["inputs"]),
            outputs=tuple(TensorSpec.from_dict(s) for s in raw["outputs"]),
            platform=raw.get("platform", ENSEMBLE if steps else "onnxruntime_onnx"),
            description=raw.get("description", ""),
            labels=tuple(raw.get("labels", ())),
            batching=Batching.from_dict(raw.get("batching", {})),
            pipeline=PipelineSpec.from_dict(raw["pipeline"]) if "pipeline" in raw else None,
            version_policy=VersionPolicy.from_dict(raw.get("version_policy")),
            tenants=tuple(tenants) if tenants is not None else None,
            queue=queue,
            generation=GenerationSpec.from_dict(raw["generation"]) if "generation" in raw else None,
            parameters=dict(parameters),
            code=code,
            graph=steps is None and ((version_dir / "model.onnx").is_file() or not code),
            time_limit_s=limit,
            steps=steps,
            extra={k: v for k, v in raw.items() if k not in known},
        )


def version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)
