"""A repository load's and unload's parameters, as Triton names them, and a load's
`config` read back onto the model's cards.

Triton's load may carry a model configuration (its JSON, `parameters.config`) to
load the model with instead of the one in its folder. Here a model's
configuration is its card.json (`app.cards`), which
`app.operations.triton.model_config` renders as Triton's; the override is that
rendering's inverse for what a card can say: `max_batch_size`,
`dynamic_batching.max_queue_delay_microseconds`, `version_policy` and
`parameters`. They are written into every readable version's card.json (a
Triton configuration is the model's, not a version's), each file replaced
atomically (a new file renamed over the old), so every process on any machine
sharing the folder reads the old card or the new one, never half of one; the
next load keeps them. A field the configuration leaves out keeps the card's
value. `name`, `platform`, `backend`, the tensors and `model_transaction_policy`
may be sent as the model has them; any other field only at its default. What
the cards cannot honour is InvalidParameter naming the field, before anything
is written.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.cards import ModelCard, TensorSpec, VersionPolicy
from app.errors import InvalidParameter

# The fields of a load's `config` that change the cards; those that must agree.
SETTABLE = (
    "max_batch_size",
    "dynamic_batching.max_queue_delay_microseconds",
    "version_policy",
    "parameters",
)
MAX_DELAY_US = 1_000_000  # a card's max_queue_delay_ms is at most 1000
_MODEL_FILE = "model.onnx"
_PUT = "PUT the file to /v2/repository/models/<name>/versions/<version>, then load"


def load_config(parameters: Mapping[str, Any] | None) -> str | None:
    """The `config` of a load's parameters (None without one). Triton's
    `file:<version>/<name>` parameters are refused (PUT the file instead), and so
    is any parameter a load does not take."""
    for key, value in (parameters or {}).items():
        if key == "config":
            if not isinstance(value, str):
                raise InvalidParameter(
                    "load parameter 'config' must be a string: the model configuration "
                    "as JSON (Triton's ModelConfig)",
                    parameter="config",
                )
        elif key.startswith("file:"):
            raise InvalidParameter(
                f"load parameter {key!r}: model files in a load request are not supported; " + _PUT,
                parameter=key,
            )
        else:
            raise InvalidParameter(
                f"unrecognized load parameter {key!r}; a load takes 'config'", parameter=key
            )
    return (parameters or {}).get("config")


def unload_dependents(parameters: Mapping[str, Any] | None) -> bool:
    """An unload's `unload_dependents` (False when absent): a boolean, or
    InvalidParameter; any other parameter is refused too."""
    for key, value in (parameters or {}).items():
        if key != "unload_dependents":
            raise InvalidParameter(
                f"unrecognized unload parameter {key!r}; an unload takes 'unload_dependents'",
                parameter=key,
            )
        if not isinstance(value, bool):
            raise InvalidParameter(
                f"unload parameter 'unload_dependents' must be a boolean, not {value!r}",
                parameter=key,
            )
    return bool((parameters or {}).get("unload_dependents", False))


@dataclass(frozen=True)
class Override:
    """What a load's `config` changes on the cards (None: keeps the card's)."""

    max_batch_size: int | None = None
    max_queue_delay_ms: float | None = None
    version_policy: VersionPolicy | None = None
    parameters: dict[str, str] | None = None

    def apply_to(self, raw: dict[str, Any]) -> dict[str, Any]:
        """`raw` (a card.json's content) with the override's fields set."""
        changed = dict(raw)
        batching = dict(changed.get("batching") or {})
        if self.max_batch_size is not None:
            batching["max_batch_size"] = self.max_batch_size
        if self.max_queue_delay_ms is not None:
            delay = self.max_queue_delay_ms
            batching["max_queue_delay_ms"] = int(delay) if delay.is_integer() else delay
        if batching:
            changed["batching"] = batching
        if self.version_policy is not None:
            changed["version_policy"] = self.version_policy.to_dict()
        if self.parameters is not None:
            changed.pop("parameters", None)
            if self.parameters:
                changed["parameters"] = dict(self.parameters)
        return changed


def parse_config(name: str, text: str, cards: list[ModelCard]) -> Override:
    """The override that `text` (Triton's model configuration, JSON) makes to
    `name`'s `cards`; InvalidParameter naming the first field they cannot honour."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise _refused("config", f"is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _refused("config", "must be a JSON object (Triton's ModelConfig)")
    fields = dict(config)
    given = fields.pop("name", "")
    if given not in ("", name):
        raise _refused("config.name", f"{given!r} names another model; this load is of {name!r}")
    _agrees(fields.pop("platform", ""), {c.platform for c in cards}, "config.platform")
    _agrees(fields.pop("backend", ""), {c.backend for c in cards}, "config.backend")
    ensemble = fields.pop("ensemble_scheduling", None)
    if ensemble is not None and ensemble not in [c.steps.triton() for c in cards if c.steps]:
        raise _refused("config.ensemble_scheduling", "a pipeline's steps change with a new "
                       "version (models add), not with a load")  # fmt: skip
    _agrees(
        fields.pop("default_model_filename", ""), {_MODEL_FILE}, "config.default_model_filename"
    )
    size = fields.pop("max_batch_size", None)
    max_batch_size = None if size is None else _integer(size, "config.max_batch_size")
    if max_batch_size:
        for card in cards:
            _check_batching(card, max_batch_size)
    delay = _delay(fields.pop("dynamic_batching", None), cards, max_batch_size)
    for key in ("input", "output"):
        if key in fields:
            _check_tensors(fields.pop(key), key, cards, max_batch_size)
    policy = fields.pop("version_policy", None)
    params = fields.pop("parameters", None)
    _check_decoupled(fields.pop("model_transaction_policy", None), cards)
    for key, value in fields.items():
        if value not in (None, "", 0, False, {}, []):
            raise _refused(
                f"config.{key}",
                "is not supported by this service (a card.json cannot say it); a load's "
                f"config may set {', '.join(SETTABLE)}",
            )
    return Override(
        max_batch_size=max_batch_size,
        max_queue_delay_ms=delay,
        version_policy=None if policy is None else _version_policy(policy),
        parameters=None if params is None else _parameters(params),
    )


def apply(cards: list[ModelCard], override: Override) -> None:
    """Write `override` into each card's card.json, each replaced atomically."""
    for card in cards:
        path = card.path / "card.json"
        raw = json.loads(path.read_text())
        staged = path.with_name(f".card.json.{uuid.uuid4().hex}.tmp")  # not `*/*/card.json`
        try:
            staged.write_text(json.dumps(override.apply_to(raw), indent=2) + "\n")
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)


def _refused(field: str, why: str) -> InvalidParameter:
    return InvalidParameter(f"{field} {why}", parameter="config", errors={field: [why]})


def _agrees(value: Any, allowed: set[str], field: str) -> None:
    if value != "" and value not in allowed:
        raise _refused(field, f"is {value!r}; this model's is {' or '.join(sorted(allowed))}")


def _integer(value: Any, field: str, least: int = 0) -> int:
    """A JSON number, or a string of digits (protobuf's JSON writes int64 so)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise _refused(field, f"must be an integer >= {least}, not {value!r}")
    return value


def _check_batching(card: ModelCard, max_batch_size: int) -> None:
    """With a batch dimension, every input and output's first dimension is free."""
    fixed = [s for s in (*card.inputs, *card.outputs) if s.shape[:1] != (-1,)]
    if fixed:
        shapes = ", ".join(f"{s.name} {list(s.shape)}" for s in fixed)
        raise _refused(
            "config.max_batch_size",
            f"{max_batch_size} needs a free first dimension (-1) on every input and output "
            f"to batch along; {card.ref} has {shapes}",
        )


def _delay(raw: Any, cards: list[ModelCard], max_batch_size: int | None) -> float | None:
    """The batching delay (ms) a `dynamic_batching` sets; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _refused("config.dynamic_batching", "must be an object")
    if max_batch_size is None:  # the cards' own
        max_batch_size = max((c.batching.max_batch_size for c in cards), default=0)
    if max_batch_size <= 0:
        raise _refused("config.dynamic_batching", "needs max_batch_size > 0")
    fields = dict(raw)
    delay_us = _integer(
        fields.pop("max_queue_delay_microseconds", 0),
        "config.dynamic_batching.max_queue_delay_microseconds",
    )
    if delay_us > MAX_DELAY_US:
        raise _refused(
            "config.dynamic_batching.max_queue_delay_microseconds",
            f"is at most {MAX_DELAY_US} (a card's max_queue_delay_ms is at most 1000)",
        )
    for key, value in fields.items():
        if value not in (None, "", 0, False, {}, []):
            why = (
                "is not supported: a worker runs up to max_batch_size rows a call, with no "
                "preferred sizes"
                if key == "preferred_batch_size"
                else "is not supported by this service (a card.json cannot say it)"
            )
            raise _refused(f"config.dynamic_batching.{key}", why)
    return delay_us / 1000


def _dims(spec: TensorSpec, batched: bool) -> list[int]:
    return list(spec.shape[1:] if batched else spec.shape)


def _check_tensors(raw: Any, key: str, cards: list[ModelCard], size: int | None) -> None:
    """A config's `input` or `output` is the model's, as `model_config` writes it:
    a load cannot change a graph's tensors."""
    field = f"config.{key}"
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise _refused(field, "must be a list of tensors")
    given = {}
    for tensor in raw:
        where = f"{field}.{tensor.get('name')}"
        extra = {k: v for k, v in tensor.items() if k not in ("name", "data_type", "dims")}
        if any(v not in (None, "", 0, False, {}, [], "FORMAT_NONE") for v in extra.values()):
            raise _refused(where, f"sets {sorted(extra)}: not supported")
        dims = [_integer(d, f"{where}.dims", -1) for d in tensor.get("dims", [])]
        given[str(tensor.get("name"))] = (tensor.get("data_type"), dims)
    for card in cards:
        batched = (card.batching.max_batch_size if size is None else size) > 0
        specs = card.inputs if key == "input" else card.outputs
        expected = {
            s.name: ("TYPE_STRING" if s.datatype == "BYTES" else f"TYPE_{s.datatype}",
                     _dims(s, batched))
            for s in specs
        }  # fmt: skip
        if given != expected:
            raise _refused(
                field,
                f"{_shown(given)} is not the model's {_shown(expected)} ({card.ref}); a load "
                "cannot change a graph's tensors",
            )


def _shown(tensors: dict[str, tuple[Any, list[int]]]) -> str:
    return "[" + ", ".join(f"{n} {t} {d}" for n, (t, d) in sorted(tensors.items())) + "]"


def _check_decoupled(raw: Any, cards: list[ModelCard]) -> None:
    if raw is None:
        return
    decoupled = raw.get("decoupled", False) if isinstance(raw, dict) else raw
    generative = any(c.generation is not None for c in cards)
    if decoupled is not generative:
        raise _refused(
            "config.model_transaction_policy.decoupled",
            f"must be {str(generative).lower()}: only a generative model's stream is decoupled",
        )


def _version_policy(raw: Any) -> VersionPolicy:
    """Triton's ModelVersionPolicy: {"latest": {"num_versions": N}}, {"all": {}} or
    {"specific": {"versions": [1, 3]}}."""
    field = "config.version_policy"
    if not isinstance(raw, dict) or len(raw) != 1:
        raise _refused(field, 'must name one of "latest", "all", "specific"')
    [(kind, value)] = raw.items()
    if kind == "all" and value in ({}, None):
        return VersionPolicy()
    if kind == "latest" and isinstance(value, dict) and set(value) <= {"num_versions"}:
        return VersionPolicy(latest=_integer(value.get("num_versions"), f"{field}.latest", 1))
    if kind == "specific" and isinstance(value, dict) and set(value) <= {"versions"}:
        versions = value.get("versions", [])
        if isinstance(versions, list) and versions:
            numbers = [_integer(v, f"{field}.specific.versions") for v in versions]
            return VersionPolicy(specific=tuple(str(v) for v in numbers))
    raise _refused(
        field,
        'must be {"latest": {"num_versions": N}}, {"all": {}} or '
        '{"specific": {"versions": [1, ...]}}',
    )


def _parameters(raw: Any) -> dict[str, str]:
    """Triton's `parameters` ({"name": {"string_value": "..."}}) as a card's."""
    if not isinstance(raw, dict):
        raise _refused("config.parameters", 'must map names to {"string_value": "..."}')
    found = {}
    for key, value in raw.items():
        if not (isinstance(value, dict) and set(value) <= {"string_value"}):
            raise _refused(f"config.parameters.{key}", 'must be {"string_value": "..."}')
        text = value.get("string_value", "")
        if not isinstance(text, str):
            raise _refused(f"config.parameters.{key}", "string_value must be a string")
        found[str(key)] = text
    return found
