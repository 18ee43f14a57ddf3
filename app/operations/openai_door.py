"""The OpenAI-compatible door's operations, together: generation calls that follow
their job, durable responses, embeddings (the container makes them as one)."""

from __future__ import annotations

from dataclasses import dataclass

from app.operations.completions import Completions
from app.operations.embeddings import Embeddings
from app.operations.responses import Responses


@dataclass(frozen=True)
class OpenAIOperations:
    completions: Completions
    responses: Responses
    embeddings: Embeddings
