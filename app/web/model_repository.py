"""Triton's model repository API, for operators: add a version (PUT the file),
load, unload, and the index of every version with its state."""

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
    state = fields.String(metadata={"enum": ["READY", "UNAVAILABLE"]})
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
        description=args["description"],
    )  # fmt: skip
    return added.to_dict(), 201


@blp.post("/models/<name>/load")
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(404, response="NOT_FOUND", description="No such model in the folder")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="A version failed to load")
@operator_only
def load(name: str) -> list[VersionStatus]:
    return services().models.load(name)


@blp.post("/models/<name>/unload")
@blp.response(200, VersionStatusSchema(many=True))
@blp.alt_response(404, response="NOT_FOUND", description="No such model in the folder")
@operator_only
def unload(name: str) -> list[VersionStatus]:
    return services().models.unload(name)


class IndexSchema(Schema):
    ready = fields.Boolean(load_default=False, metadata={"description": "Only READY versions"})


@blp.post("/index")
@operator_only
@blp.arguments(IndexSchema(), required=False)
@blp.response(200, VersionStatusSchema(many=True))
def index(body: dict[str, Any]) -> list[VersionStatus]:
    """Every version in the folder: READY, or UNAVAILABLE with the reason
    (Triton's index; `{"ready": true}` lists only READY ones)."""
    return services().models.index(ready_only=bool(body.get("ready")))
