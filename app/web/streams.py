"""/streams: a tenant's stream bindings (the stream door's configuration).
Handlers only translate HTTP; the consumer process does the reading."""

from __future__ import annotations

import uuid
from typing import Any, cast

from marshmallow import Schema, fields, validate

from app.operations import BindingFields
from app.operations.bindings import BindingSchema, StreamBinding
from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint, links_by_id
from app.web.context import services

blp = Blueprint(
    "streams", __name__, url_prefix="/streams",
    description="Stream bindings: a model between an input log and an output log",
)  # fmt: skip

LOG_NAME = validate.Length(min=1, max=300)


def binding_links(pointer: str = "/id") -> dict[str, Any]:
    """What a client does with a binding it got: read, change or delete it."""
    return links_by_id(
        pointer,
        GetBinding="get /streams/{binding_id}",
        UpdateBinding="patch /streams/{binding_id}",
        DeleteBinding="delete /streams/{binding_id}",
    )


class BindingFieldsSchema(Schema):
    model = fields.String(validate=validate.Length(min=1, max=100),
                          metadata={"example": "digits"})  # fmt: skip
    version = fields.String(allow_none=True, validate=validate.Length(min=1, max=50),
                            metadata={"description": "None: the newest"})  # fmt: skip
    output = fields.String(
        validate=LOG_NAME,
        metadata={"description": "The log results are appended to: a name of [A-Za-z0-9._-] "
                  "(made `<prefix>:<tenant>:<name>`), or that full name", "example": "results"},
    )  # fmt: skip
    paused = fields.Boolean(metadata={"description": "A paused binding's input is not read"})


class CreateBindingSchema(BindingFieldsSchema):
    input = fields.String(
        required=True, validate=LOG_NAME,
        metadata={"description": "The log producers append requests to: a name of "
                  "[A-Za-z0-9._-] (made `<prefix>:<tenant>:<name>`), or that full name",
                  "example": "requests"},
    )  # fmt: skip

    def on_bind_field(self, field_name: str, field_obj: fields.Field) -> None:
        field_obj.required = field_name in ("model", "input", "output")


class BindingListSchema(Schema):
    items = fields.List(fields.Nested(BindingSchema))


@blp.post("")
@blp.response(201, BindingSchema, links=binding_links())
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model")
@blp.alt_response(409, response="CONFLICT", description="The input log is bound already")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="A log name is not yours")
@authenticated
@blp.arguments(CreateBindingSchema())
def create_binding(body: dict[str, Any]) -> tuple[StreamBinding, int, dict[str, str]]:
    binding = services().bindings.create(current_tenant(), cast(BindingFields, body))
    return binding, 201, {"Location": f"/streams/{binding.id}"}


@blp.get("")
@blp.response(200, BindingListSchema, links=binding_links("/items/0/id"))
@authenticated
def list_bindings() -> dict[str, Any]:
    return {"items": services().bindings.list_bindings(current_tenant())}


@blp.get("/<uuid:binding_id>")
@blp.response(200, BindingSchema, links=binding_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such binding for this tenant")
@authenticated
def get_binding(binding_id: uuid.UUID) -> StreamBinding:
    return services().bindings.get(current_tenant(), binding_id)


@blp.patch("/<uuid:binding_id>")
@blp.response(200, BindingSchema, links=binding_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such binding, or unknown model")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="A log name is not yours")
@authenticated
@blp.arguments(BindingFieldsSchema())
def update_binding(changes: dict[str, Any], binding_id: uuid.UUID) -> StreamBinding:
    """Change the model, its version, the output log or `paused`; the input log
    cannot change (make another binding)."""
    return services().bindings.update(current_tenant(), binding_id, cast(BindingFields, changes))


@blp.delete("/<uuid:binding_id>")
@blp.response(204)
@blp.alt_response(404, response="NOT_FOUND", description="No such binding for this tenant")
@authenticated
def delete_binding(binding_id: uuid.UUID) -> None:
    """Its jobs stay; so do its logs and consumer group (a new binding of the same
    input log goes on where this one stopped)."""
    services().bindings.delete(current_tenant(), binding_id)
