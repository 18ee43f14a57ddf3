"""A stream binding as clients see it: the API and `manage.py streams` show this."""

from __future__ import annotations

from marshmallow import Schema, fields


class BindingSchema(Schema):
    id = fields.UUID()
    model = fields.String()
    version = fields.String(
        attribute="model_version", allow_none=True, metadata={"description": "null: the newest"}
    )
    input = fields.String(
        metadata={"description": "The full name of the log producers append requests to "
                  "(XADD), under your prefix", "example": "streams:acme:requests"}
    )  # fmt: skip
    output = fields.String(
        metadata={"description": "The full name of the log each result is appended to",
                  "example": "streams:acme:results"}
    )  # fmt: skip
    dead_letter = fields.String(
        metadata={"description": "Where entries that cannot become a job go, with the reason",
                  "example": "streams:acme:requests.dead"}
    )  # fmt: skip
    paused = fields.Boolean(metadata={"description": "A paused binding's input is not read"})
    created_at = fields.DateTime()
    updated_at = fields.DateTime()
