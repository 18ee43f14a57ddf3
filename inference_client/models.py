"""`client.models`: the models a key may use and their KServe v2 metadata, which
also names a one-input model's input when a call gives a bare array."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from inference_client import tensors

if TYPE_CHECKING:
    from inference_client.client import Client

__all__ = ["Models"]

METADATA_TTL_S = 60.0


class Models:
    """The models this key may use (`client.models`)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._metadata: dict[tuple[str, str | None], tuple[float, dict[str, Any]]] = {}

    def list(self) -> builtins.list[dict[str, Any]]:
        """GET /models: the models this key may use, with inputs, outputs, labels."""
        models: builtins.list[dict[str, Any]] = self._client._json("GET", "/models")["models"]
        return models

    def get(self, name: str, version: str | None = None) -> dict[str, Any]:
        """KServe v2 metadata (`name`, `versions`, `inputs`, `outputs`), kept a minute."""
        key = (name, version)
        cached = self._metadata.get(key)
        if cached is not None and time.monotonic() - cached[0] < METADATA_TTL_S:
            return cached[1]
        metadata = self._client._json("GET", model_path(name, version))
        self._metadata[key] = (time.monotonic(), metadata)
        return metadata

    def input_names(self, name: str, version: str | None = None) -> builtins.list[str]:
        return [str(spec["name"]) for spec in self.get(name, version).get("inputs", [])]


def model_path(name: str, version: str | None) -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version is not None else "")


def named_inputs(models: Models, model: str, version: str | None, inputs: Any) -> dict[str, Any]:
    """`{"<input>": value}` from a mapping, or from a bare array or nested list
    for a model with one input (named from its metadata)."""
    if isinstance(inputs, Mapping):
        return {str(name): value for name, value in inputs.items()}
    names = models.input_names(model, version)
    if len(names) != 1:
        raise ValueError(
            f"model {model} has inputs {', '.join(names)}: pass a mapping "
            "{input name: value} instead of one array"
        )
    return {names[0]: inputs}


def job_inputs(models: Models, model: str, version: str | None, inputs: Any) -> Any:
    """A job's `inputs` as JSON: v2 tensors as they are, else named and made plain."""
    if tensors.is_v2_tensors(inputs):
        return [tensors.v2_tensor(tensor) for tensor in inputs]
    return tensors.jsonable(named_inputs(models, model, version, inputs))
