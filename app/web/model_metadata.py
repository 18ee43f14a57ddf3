"""Model metadata: our /models listing and KServe v2 (Open Inference Protocol), with
Triton's model configuration and statistics extensions."""

from __future__ import annotations

from typing import Any

from app.operations.models import ModelCard
from app.web.auth import authenticated, current_tenant, optional_tenant
from app.web.blueprint import Blueprint
from app.web.context import services
from app.web.record_schemas import (
    ModelConfigSchema,
    ModelListSchema,
    ModelMetadataSchema,
    ModelStatisticsSchema,
)

blp = Blueprint("models", __name__, description="Models served")


def _resolve(name: str, version: str | None = None) -> ModelCard:
    """What the caller may see: models its tenant is granted (open ones without
    a key); others answer 404 like absent ones. UnknownModel: 404 via app.web.problems."""
    return services().models.model(optional_tenant(), name, version)


@blp.get("/models")
@blp.response(200, ModelListSchema)
@blp.alt_response(401, response="UNAUTHORIZED", description="A key was sent and is not valid")
def list_models() -> dict[str, Any]:
    """The serving models; with a tenant's key, also those granted to it."""
    served = services().models.list_models(optional_tenant())
    return {"models": [{**card.to_dict(), "versions": versions} for card, versions in served]}


@blp.get("/v2/models/<name>")
@blp.response(200, ModelMetadataSchema)
def model_metadata(name: str) -> dict[str, Any]:
    return _v2_metadata(_resolve(name))


@blp.get("/v2/models/<name>/versions/<version>")
@blp.response(200, ModelMetadataSchema)
def model_version_metadata(name: str, version: str) -> dict[str, Any]:
    return _v2_metadata(_resolve(name, version))


@blp.get("/v2/models/<name>/ready")
@blp.get("/v2/models/<name>/versions/<version>/ready")
@blp.response(200, description="The model's files are present and its card is readable")
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model or version")
@blp.alt_response(503, response="SERVICE_UNAVAILABLE", description="Known, but its file is gone")
def model_ready(name: str, version: str | None = None) -> dict[str, Any]:
    """Answers by status, as KServe clients read it: 200 only when ready."""
    card = services().models.model_ready(optional_tenant(), name, version)
    return {"name": card.name, "version": card.version, "ready": True}


@blp.get("/v2/models/<name>/config")
@blp.get("/v2/models/<name>/versions/<version>/config")
@blp.response(200, ModelConfigSchema)
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model or version")
def model_config(name: str, version: str | None = None) -> dict[str, Any]:
    """Triton's model configuration, as its JSON (what gRPC ModelConfig answers)."""
    return services().models.model_config(optional_tenant(), name, version)


@blp.get("/v2/models/stats")
@blp.get("/v2/models/<name>/stats")
@blp.get("/v2/models/<name>/versions/<version>/stats")
@blp.response(200, ModelStatisticsSchema)
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model or version")
@authenticated
def model_statistics(name: str | None = None, version: str | None = None) -> dict[str, Any]:
    """Triton's statistics extension, counted from your own jobs only (never another
    tenant's): per serving version of every model you may use, of the model, or of
    the version. compute_input and compute_output are not measured apart from
    compute_infer: their ns is 0; execution_count counts requests, not micro-batches."""
    return services().models.statistics(current_tenant(), name, version)


def _v2_metadata(card: ModelCard) -> dict[str, Any]:
    return {
        "name": card.name,
        "versions": [card.version],
        "platform": card.platform,
        "inputs": [s.to_dict() for s in card.inputs],
        "outputs": [s.to_dict() for s in card.outputs],
    }
