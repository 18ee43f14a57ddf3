"""The generation parameters are declared once (app.cards.parameters): every reader
sees each declared parameter (the card, the request parser, the OpenAI and
Responses bodies, Sampling), and each number's or integer's limits refuse with
its own words. In process: no model, no server."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import orjson
import pytest

from app.cards import GenerationSpec
from app.cards.parameters import NAMES, PARAMETERS, Parameter
from app.generation.openai_objects import completion_request
from app.generation.requests import GenerationRequest, parse
from app.generation.responses import Shown, read_create, response_object
from app.runtime.sampling import Sampling
from app.runtime.tensors import InvalidInputs

SPEC = GenerationSpec(
    context_length=8192, max_tokens=2048, default_max_tokens=256,
    roles=("system", "user", "assistant"), default_system=None,
    special={"im_start": 1, "im_end": 2}, stop_tokens=(2,),
)  # fmt: skip
NUMERIC = [p for p in PARAMETERS if p.kind != "own"]
# A good value of each parameter of its own shape, and the parameters it needs beside it.
OWN: dict[str, tuple[Any, dict[str, Any]]] = {
    "stop": (["end"], {}),
    "logit_bias": ({"7": 5}, {}),
    "logprobs": (True, {}),
    "top_logprobs": (3, {"logprobs": True}),
    "response_format": ({"type": "json_object"}, {}),
    "labels": (["yes", "no"], {}),
}


def _good(parameter: Parameter) -> Any:
    """A value within the limits that is not the default (so a reader must keep it)."""
    if parameter.kind == "own":
        return OWN[parameter.name][0]
    high = SPEC.max_tokens if parameter.card_limits else parameter.high
    if high is None:
        value = parameter.low + 3
    elif high != parameter.default:
        value = high
    else:
        value = (parameter.low + high) / 2
    return float(value) if parameter.kind == "number" else int(value)


def _name(parameter: Parameter) -> str:
    return parameter.name


def _parse(parameters: dict[str, Any]) -> GenerationRequest:
    return parse(SPEC, {"prompt": "a"}, parameters)


def _errors(parameters: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidInputs) as caught:
        _parse(parameters)
    return caught.value.errors


def test_every_parameter_of_its_own_shape_has_a_sample_here() -> None:
    assert {p.name for p in PARAMETERS if p.kind == "own"} == set(OWN)


def test_the_card_lists_the_declared_parameters_in_order() -> None:
    assert SPEC.to_dict()["parameters"] == list(NAMES)


def test_sampling_s_fields_and_defaults_are_the_declared() -> None:
    fields = {field.name: field.default for field in dataclasses.fields(Sampling)}
    assert set(fields) == {p.name for p in PARAMETERS if p.sampling}
    for parameter in NUMERIC:
        if not parameter.card_limits:
            assert fields[parameter.name] == parameter.default, parameter.name
            assert type(fields[parameter.name]) is type(parameter.default), parameter.name


@pytest.mark.parametrize("parameter", PARAMETERS, ids=_name)
def test_the_parser_takes_every_declared_parameter(parameter: Parameter) -> None:
    value = _good(parameter)
    assert value != parameter.default
    beside = OWN.get(parameter.name, (None, {}))[1]
    request = _parse({**beside, parameter.name: value})
    if parameter.name == "response_format":
        assert request.constraint is not None
    elif parameter.name == "labels":
        assert request.labels == tuple(value)
    elif parameter.name == "top_logprobs":
        assert request.sampling.logprobs == value
    elif parameter.kind == "own":
        assert getattr(request.sampling, parameter.name) not in (None, ())
    else:
        assert getattr(request.sampling, parameter.name) == value
    assert GenerationRequest.from_json(request.to_json()) == request


@pytest.mark.parametrize("parameter", [p for p in PARAMETERS if p.json], ids=_name)
def test_an_object_or_list_parameter_may_come_as_its_json(parameter: Parameter) -> None:
    value = _good(parameter)
    as_json = orjson.dumps(value).decode()
    assert _parse({parameter.name: as_json}) == _parse({parameter.name: value})
    assert parameter.name in _errors({parameter.name: "{not json"})


def _out_of_range(parameter: Parameter) -> list[Any]:
    values: list[Any] = [parameter.low - 1, True, "1", [1]]
    if parameter.high is not None:
        values.append(parameter.high + 1)
    if parameter.kind == "number":
        values += [float("inf"), float("nan")]
    else:
        values.append(parameter.low + 0.5)
    return values


@pytest.mark.parametrize("parameter", NUMERIC, ids=_name)
def test_a_value_out_of_range_is_refused_with_the_parameter_s_words(
    parameter: Parameter,
) -> None:
    if parameter.card_limits:
        parameter = parameter.bounded(SPEC.default_max_tokens, SPEC.max_tokens)
    for value in _out_of_range(parameter):
        errors = _errors({parameter.name: value})
        assert errors == {parameter.name: f"expected {parameter.expected()}, got {value!r}"}
    if parameter.above:
        assert list(_errors({parameter.name: parameter.low})) == [parameter.name]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"max_tokens": 0}, "expected an integer from 1 to 2048, got 0"),
        ({"temperature": 2.5}, "expected a number from 0 to 2, got 2.5"),
        ({"top_p": -1}, "expected a number from 0 to 1, got -1"),
        ({"top_p": 0}, "expected a number above 0 and at most 1"),
        ({"top_k": -1}, "expected an integer of 0 (no limit) or more, got -1"),
        ({"seed": 2**63}, f"expected an integer from 0 to 2**63 - 1, got {2**63}"),
        ({"presence_penalty": -3}, "expected a number from -2 to 2, got -3"),
        ({"frequency_penalty": True}, "expected a number from -2 to 2, got True"),
        ({"repetition_penalty": 0}, "expected a number above 0 and at most 10 (1: none)"),
        ({"repetition_penalty": 11}, "expected a number from 0 to 10, got 11"),
    ],
)
def test_the_words_are_those_the_doors_always_gave(
    parameters: dict[str, Any], message: str
) -> None:
    assert list(_errors(parameters).values()) == [message]


def test_the_defaults_are_stored_as_they_always_were() -> None:
    """(A parameter declared since is stored beside them.)"""
    before = (
        '{"prompt":"a","parameters":{"max_tokens":256,"temperature":1.0,"top_p":1.0,'
        '"top_k":0,"stop":[],"presence_penalty":0.0,"frequency_penalty":0.0,'
        '"repetition_penalty":1.0,"logit_bias":[]}}'
    )
    stored, names = _parse({}).to_json(), orjson.loads(before)["parameters"]
    kept = {k: v for k, v in stored["parameters"].items() if k in names}
    assert orjson.dumps({**stored, "parameters": kept}).decode() == before


@pytest.mark.parametrize("parameter", PARAMETERS, ids=_name)
def test_openai_s_bodies_map_every_declared_parameter(parameter: Parameter) -> None:
    value = _good(parameter)
    for field in parameter.openai:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
        assert completion_request(body, chat=True).parameters == {parameter.name: value}
        text = completion_request({"model": "m", "prompt": "hi", field: value}, chat=False)
        assert text.parameters[parameter.name] == value


@pytest.mark.parametrize("parameter", [p for p in PARAMETERS if p.responses], ids=_name)
def test_the_responses_body_maps_and_shows_back_what_it_takes(parameter: Parameter) -> None:
    assert parameter.responses is not None
    value = _good(parameter)
    ask = read_create({"model": "m", "input": "hi", parameter.responses: value})
    assert ask.parameters == {parameter.name: value}
    shown = Shown(uuid.uuid4(), "m", "succeeded", 1.0, ask.record(), "text")
    assert response_object(shown)[parameter.responses] == value
