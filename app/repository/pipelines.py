"""A pipeline checked against the repository when it is added: each step's model is
there (a chat model's step with parameters it knows), each of its inputs is fed, and
every source gives what it takes (the same datatype, rank and fixed sizes; a
mapped source gives one row an element). What is wrong is refused naming the
step, and nothing is placed."""

from __future__ import annotations

from collections.abc import Callable

from app.cards import ModelCard, Step, TensorSpec
from app.cards.steps import CHAT_FIELDS, CHAT_OUTPUTS
from app.errors import InvalidModel

Find = Callable[[str, str | None], ModelCard | None]


def check(card: ModelCard, find: Find) -> None:
    assert card.steps is not None
    specs: dict[str, TensorSpec] = {spec.name: spec for spec in card.inputs}
    for step in card.steps.order:
        model = _model(card, step, find)
        wanted = {spec.name: spec for spec in model.inputs}
        extra = sorted(set(step.inputs) - set(wanted))
        unfed = sorted(set(wanted) - set(step.inputs))
        if extra or unfed:
            raise _refused(step, f"model {model.ref} takes {sorted(wanted)}; the step feeds "
                           f"{sorted(step.inputs)}" + (f" (no input {extra})" if extra else "")
                           + (f" and leaves {unfed} unfed" if unfed else ""))  # fmt: skip
        for name, source in step.inputs.items():
            given = _given(step, source, specs)
            if source == step.map:
                given = TensorSpec(given.name, given.datatype, (1, *given.shape[1:]))
            _fits(step, f"input {name!r}", wanted[name], source, given)
        for source in step.when:
            _given(step, source, specs)
        chat = [TensorSpec(name, datatype, shape) for name, datatype, shape in CHAT_OUTPUTS]
        outputs = model.outputs if model.generation is None else chat
        for spec in outputs:
            specs[f"{step.name}.{spec.name}"] = spec
    for output in card.outputs:
        source = card.steps.outputs[output.name]
        found = specs.get(source)
        if found is None:
            raise InvalidModel(f"output {output.name!r} takes {source!r}, which no step gives")
        if found.datatype != output.datatype or len(found.shape) != len(output.shape):
            raise InvalidModel(f"output {output.name!r} is {_shown(output)}; {source!r} gives "
                               f"{_shown(found)}")  # fmt: skip


def _model(card: ModelCard, step: Step, find: Find) -> ModelCard:
    if step.model == card.name:
        raise _refused(step, "a pipeline cannot run itself")
    model = find(step.model, step.version)
    if model is None:
        what = f"model {step.model!r}" + (f" version {step.version!r}" if step.version else "")
        raise _refused(step, f"{what} is not in the repository: add it first")
    if model.generation is not None:
        _chat(step, model)
    elif step.parameters:
        raise _refused(step, f"parameters are a chat model's; model {model.ref} takes none")
    return model


def _chat(step: Step, model: ModelCard) -> None:
    """A chat model's step: parameters it knows, labels of strings."""
    assert model.generation is not None
    known = {*model.generation.to_dict()["parameters"], *CHAT_FIELDS}
    unknown = sorted(set(step.parameters) - known)
    if unknown:
        raise _refused(step, f"model {model.ref} takes no parameter {unknown}; it takes "
                       f"{sorted(known)}")  # fmt: skip
    labels = step.parameters.get("labels")
    if labels is not None and not (
        isinstance(labels, list) and labels and all(isinstance(x, str) and x for x in labels)
    ):
        raise _refused(step, "labels: a list of the labels to score, each a non-empty string")


def _given(step: Step, source: str, specs: dict[str, TensorSpec]) -> TensorSpec:
    given = specs.get(source)
    if given is None:
        made = sorted(s for s in specs if s.startswith(source.split(".", 1)[0] + "."))
        raise _refused(step, f"it takes {source!r}, which its source does not give"
                       + (f" (it gives {made})" if made else ""))  # fmt: skip
    return given


def _fits(step: Step, what: str, wanted: TensorSpec, source: str, given: TensorSpec) -> None:
    sizes = len(wanted.shape) == len(given.shape) and all(
        w < 0 or g < 0 or w == g for w, g in zip(wanted.shape, given.shape, strict=True)
    )
    if wanted.datatype != given.datatype or not sizes:
        raise _refused(step, f"its {what} is {_shown(wanted)}; {source!r} gives {_shown(given)}")


def _shown(spec: TensorSpec) -> str:
    return f"{spec.datatype} {list(spec.shape)}"


def _refused(step: Step, why: str) -> InvalidModel:
    return InvalidModel(f"step {step.name!r}: {why}")
