"""A pipeline's card: a model whose `steps` name other models, each taking its
inputs from the request or from earlier steps' outputs (Triton's ensemble,
Celery's chain, group and chord, as one durable job).

    "platform": "ensemble",
    "inputs":  [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "digit", "datatype": "INT64", "shape": [-1], "from": "answer.digit"}],
    "steps": [
      {"name": "decode", "model": "digit-decode", "inputs": {"image": "image"}},
      {"name": "classify", "model": "digits", "inputs": {"pixels": "decode.pixels"}},
      {"name": "answer", "model": "digit-answer",
       "inputs": {"label": "classify.label", "probabilities": "classify.probabilities"}}
    ]

A source is a request input's name or `<step>.<output>`. A chat model's step takes
its `text_input` and its `parameters` (sampling or `labels`, and a `system`
message), and gives `text_output` (and `label` and `scores` where it scores
labels: app.generation.oneshot). A step may `map` over a
source: each element along its first axis is a request of its own to the step's
model (micro-batched with every other element and job), and the step's outputs
are the elements' gathered in order. A step may run only `when` a source's values
are all among those listed (`{"classify.label": [1, 2]}`); a step that does not
run gives no rows. Steps run in the order their sources need (a cycle is refused).
Each finished step is recorded with its job, so a retried job resumes at its
first unfinished step (app.execution.steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENSEMBLE = "ensemble"
# What a chat model's step gives (app.generation.oneshot), whatever its card says.
CHAT_OUTPUTS = (("text_output", "BYTES", (1,)), ("label", "BYTES", (1,)), ("scores", "FP32", (-1,)))
CHAT_FIELDS = ("system",)  # a chat step's parameters beside the sampling ones


@dataclass(frozen=True)
class Step:
    name: str
    model: str
    inputs: dict[str, str]  # the step model's input -> its source
    version: str | None = None
    map: str | None = None  # the source whose elements are a request each
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # A chat model's step: its sampling (or `labels` to score) and `system` message.
    parameters: dict[str, Any] = field(default_factory=dict)
    # Tries of a request of this step before its job fails (its own retry policy).
    max_attempts: int = 1

    def sources(self) -> set[str]:
        return {*self.inputs.values(), *([self.map] if self.map else []), *self.when}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            **({"version": self.version} if self.version else {}),
            "inputs": dict(self.inputs),
            **({"map": self.map} if self.map else {}),
            **({"when": {k: list(v) for k, v in self.when.items()}} if self.when else {}),
            **({"parameters": dict(self.parameters)} if self.parameters else {}),
            **({"max_attempts": self.max_attempts} if self.max_attempts != 1 else {}),
        }


@dataclass(frozen=True)
class Steps:
    """The steps in the order they run, and where each output of the card comes from."""

    order: tuple[Step, ...]
    outputs: dict[str, str]  # the card's output -> its source

    def to_dict(self) -> list[dict[str, Any]]:
        return [step.to_dict() for step in self.order]

    def triton(self) -> dict[str, Any]:
        """Triton's `ensemble_scheduling`: each step's model and the tensors it takes
        and gives (a pipeline output's tensor by its name, others as <step>.<output>)."""
        named = {source: name for name, source in self.outputs.items()}

        def tensor(source: str) -> str:
            return named.get(source, source)

        used = {s for step in self.order for s in step.sources()} | set(self.outputs.values())
        return {"step": [{
            "model_name": step.model,
            "model_version": int(step.version or -1) if (step.version or "-").isdigit() else -1,
            "input_map": {k: tensor(s) for k, s in step.inputs.items()},
            "output_map": {s.split(".", 1)[1]: tensor(s) for s in sorted(used)
                           if step_of(s) == step.name},
        } for step in self.order]}  # fmt: skip


def step_of(source: str) -> str | None:
    """The step a source names (`decode.pixels` -> decode), None for a request input."""
    return source.split(".", 1)[0] if "." in source else None


def parse(raw: dict[str, Any], inputs: list[str], outputs: list[dict[str, Any]]) -> Steps:
    """A card's `steps` (ValueError naming the step and what is wrong)."""
    listed = raw.get("steps")
    if not isinstance(listed, list) or not listed:
        raise ValueError("steps: a list of {name, model, inputs} (a pipeline has one at least)")
    steps: dict[str, Step] = {}
    for index, item in enumerate(listed):
        step = _step(index, item)
        if step.name in steps or step.name in inputs:
            raise ValueError(f"steps[{index}]: the name {step.name!r} is taken")
        steps[step.name] = step
    for step in steps.values():
        for source in step.sources():
            _known(f"step {step.name!r}", source, steps, inputs)
    sources: dict[str, str] = {}
    for output in outputs:
        taken = output.get("from")
        if not isinstance(taken, str):
            raise ValueError(f"outputs: {output.get('name')!r} names its source, "
                             '"from": "<step>.<output>"')  # fmt: skip
        _known(f"output {output.get('name')!r}", taken, steps, inputs)
        sources[str(output["name"])] = taken
    return Steps(_ordered(steps), sources)


def _step(index: int, item: Any) -> Step:
    where = f"steps[{index}]"
    if not isinstance(item, dict) or not {"name", "model", "inputs"} <= set(item):
        raise ValueError(f"{where}: an object with name, model and inputs")
    name, model, inputs = item["name"], item["model"], item["inputs"]
    if not (isinstance(name, str) and name and "." not in name):
        raise ValueError(f"{where}: name is a word without dots")
    where = f"step {name!r}"
    if not isinstance(model, str) or not model:
        raise ValueError(f"{where}: model names the model it runs")
    if not (isinstance(inputs, dict) and inputs
            and all(isinstance(v, str) for v in inputs.values())):  # fmt: skip
        raise ValueError(f"{where}: inputs maps each of its model's inputs to a source")
    mapped = item.get("map")
    if mapped is not None and (not isinstance(mapped, str) or mapped not in inputs.values()):
        raise ValueError(f"{where}: map names a source one of its inputs takes")
    when = item.get("when", {})
    if not (isinstance(when, dict) and all(isinstance(v, list) and v for v in when.values())):
        raise ValueError(f'{where}: when maps a source to the values it runs for, e.g. '
                         '{"classify.label": [1, 2]}')  # fmt: skip
    version, parameters = item.get("version"), item.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ValueError(f"{where}: parameters is an object (a chat model's sampling, labels)")
    attempts = item.get("max_attempts", 1)
    if isinstance(attempts, bool) or not (isinstance(attempts, int) and 1 <= attempts <= 10):
        raise ValueError(f"{where}: max_attempts is a number of tries from 1 to 10")
    return Step(name, model, dict(inputs), None if version is None else str(version), mapped,
                {k: tuple(v) for k, v in when.items()}, dict(parameters), attempts)  # fmt: skip


def _known(what: str, source: str, steps: dict[str, Step], inputs: list[str]) -> None:
    step = step_of(source)
    if step is None and source not in inputs:
        raise ValueError(f"{what} takes {source!r}, which is no input of the pipeline "
                         f"({', '.join(inputs)}) nor <step>.<output>")  # fmt: skip
    if step is not None and step not in steps:
        raise ValueError(f"{what} takes {source!r} from a step that is not there "
                         f"(steps: {', '.join(steps)})")  # fmt: skip


def _ordered(steps: dict[str, Step]) -> tuple[Step, ...]:
    """The steps, each after those it takes from (listed order where free); a cycle
    is refused naming its steps."""
    done: list[str] = []
    waiting = dict(steps)
    while waiting:
        ready = [name for name, step in waiting.items()
                 if all(step_of(s) in (None, *done) for s in step.sources())]  # fmt: skip
        if not ready:
            cycle = ", ".join(sorted(waiting))
            raise ValueError(f"steps {cycle} take from each other (a cycle): a step takes "
                             "from the request or from steps before it")  # fmt: skip
        for name in ready:
            done.append(name)
            del waiting[name]
    return tuple(steps[name] for name in done)
