"""`client.embeddings`: a text-embedding model's vectors, over the service's
OpenAI-compatible POST /v1/embeddings (one sync call; errors there are OpenAI's
error object, which `ApiError` reads as well)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inference_client import tensors

if TYPE_CHECKING:
    from inference_client.client import Client

__all__ = ["Embeddings"]

SYNC_WAIT_S = 60.0  # what a sync call may wait for a worker, past the read timeout


class Embeddings:
    """Vectors of texts (`client.embeddings`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self, model: str, input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """POST /v1/embeddings: a vector per input (a string, strings, or token
        ids of the model's tokenizer), in the order given. An input longer than
        the model takes is refused (400, naming it), not cut."""
        body: dict[str, Any] = {"model": model, "input": tensors.jsonable(input),
                                "encoding_format": "float"}  # fmt: skip
        answer = self._client._json("POST", "/v1/embeddings", json=body,
                                    timeout=self._client.timeout + SYNC_WAIT_S)  # fmt: skip
        data = sorted(answer["data"], key=lambda item: int(item["index"]))
        return [item["embedding"] for item in data]
