"""Triton's model repository extension, for operators: the index of every version
with its state, load (with Triton's `config` parameter) and unload (with
`unload_dependents`), and our own PUT of a version's file. The gRPC door's
RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload call the same
operations."""

from __future__ import annotations

from typing import Any

from flask import request
from marshmallow import Schema, fields

from app.operations.models import VersionStatus
from app.web.auth import operator_only
from app.web.blueprint import Blueprint
from app.web.context import services

blp = Blueprint(
    "repository", __name__, url_prefix="/v2/repository", description="Model repository (operators)"
)


class VersionStatusSchema(Schema):
    name = fields.String()
    version = fields.String()
    state = fields.String(
        metadata={
            "enum": ["READY", "UNAVAILABLE", "LOADING"],
            "description": "LOADING while a load checks a version that was not serving",
        }
    )
    reason = fields.String()


class AddedSchema(Schema):
    name = fields.String()
    version = fields.String()
    replaced = fields.Boolean()
    card = fields.Dict(metadata={"description": "The card.json drafted from the graph"})
    skipped_outputs = fields.List(
        fields.String(), metadata={"description": "Outputs of types a job cannot return"}
    )


class PutArgsSchema(Schema):
    force = fields.Boolean(load_default=False, metadata={"description": "Replace the version"})
    description = fields.String(load_default="")


_MODEL_FILE = {
    "description": "The model.onnx file's bytes (Content-Type: application/octet-stream), "
    "up to MAX_MODEL_BYTES (2 GiB by default), streamed to disk",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}


@blp.put("/models/<name>/versions/<version>")
@blp.doc(requestBody=_MODEL_FILE)
@operator_only
@blp.arguments(PutArgsSchema(), location="query")
@blp.response(201, AddedSchema)
@blp.alt_response(409, response="CONFLICT", description="The version exists (use ?force=true)")
@blp.alt_response(413, response="REQUEST_ENTITY_TOO_LARGE", description="Over MAX_MODEL_BYTES")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Not a model that can serve")
def put_version(args: dict[str, Any], name: str, version: str) -> tuple[dict[str, Any], int]:
    limit = services().settings.max_model_bytes
    request.max_content_length = limit  # this route only
    added = services().models.add_upload(
        request.stream.read, name, version, limit, force=args["force"],
        description=args["description"], allow_code=services().settings.allow_code_uploads,
    )  # fmt: skip
    return added.to_dict(), 201


class LoadSchema(Schema):
    parameters = fields.Dict(
        keys=fields.String(),
        load_default=dict,
        metadata={
            "description": "Triton's load parameters: `config`, a model configuration as a "
            "JSON string, whose max_batch_size, dynamic_batching.max_queue_delay_microseconds, "
            "version_policy and parameters are written into the model's card.json files "
            "before the load (any other field only as the model has it). Triton's "
            "`file:<version>/<name>` parameters are refused: PUT the file instead.",
            "example": {"config": '{"max_batch_size": 16}'},
        },
    )


class UnloadSchema(Schema):
    parameters = fields.Dict(
        keys=fields.String(),
        load_default=dict,
        metadata={
            "description": "Triton's unload parameters: `unload_dependents` (a boolean), "
            "taken and changing nothing, as no model here has dependents (no ensembles)",
            "example": {"unload_dependents": False},
        },
    )


_BAD_PARAMETER = "A parameter of the wrong type, not taken, or a config field not honoured"


@blp.post("/models/<name>/load")
@operator_only
@blp.arguments(LoadSchema(), required=False)
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(400, response="BAD_REQUEST", description=_BAD_PARAMETER)
@blp.alt_response(404, response="NOT_FOUND", description="No such model in the folder")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="A version failed to load")
def load(body: dict[str, Any], name: str) -> list[VersionStatus]:
    """Load (or reload) the model: every version checked with ONNX Runtime (Triton's
    load, `{"parameters": {"config": "<JSON>"}}` to change its configuration first)."""
    return services().models.load(name, body.get("parameters"))


@blp.post("/models/<name>/unload")
@operator_only
@blp.arguments(UnloadSchema(), required=False)
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(400, response="BAD_REQUEST", description=_BAD_PARAMETER)
@blp.alt_response(404, response="NOT_FOUND", description="No such model in the folder")
def unload(body: dict[str, Any], name: str) -> list[VersionStatus]:
    """Stop serving every version of the model (Triton's unload)."""
    return services().models.unload(name, parameters=body.get("parameters"))


@blp.post("/models/<name>/versions/<version>/unload")
@operator_only
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(404, response="NOT_FOUND", description="No such model or version")
def unload_version(name: str, version: str) -> list[VersionStatus]:
    """Stop serving one version of the model (rolling: new calls go to the versions
    that serve at once; calls already running on it finish)."""
    return services().models.unload(name, version)


@blp.delete("/models/<name>")
@operator_only
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(404, response="NOT_FOUND", description="No such model in the folder")
def remove(name: str) -> list[VersionStatus]:
    """Delete every version of the model from the repository; every process stops
    serving it within a second (calls already running on it finish)."""
    return services().models.remove(name)


@blp.delete("/models/<name>/versions/<version>")
@operator_only
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(404, response="NOT_FOUND", description="No such model or version")
def remove_version(name: str, version: str) -> list[VersionStatus]:
    """Delete one version of the model from the repository; the versions left."""
    return services().models.remove(name, version)


class IndexSchema(Schema):
    ready = fields.Boolean(load_default=False, metadata={"description": "Only READY versions"})


@blp.post("/index")
@operator_only
@blp.arguments(IndexSchema(), required=False)
@blp.response(200, VersionStatusSchema(many=True))
def index(body: dict[str, Any]) -> list[VersionStatus]:
    """Every version in the folder: READY, UNAVAILABLE with the reason, or LOADING
    while a load checks it (Triton's index; `{"ready": true}` lists only READY ones)."""
    return services().models.index(ready_only=bool(body.get("ready")))
