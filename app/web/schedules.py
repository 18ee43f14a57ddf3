"""/schedules: cron schedules whose runs are batches. Handlers only translate HTTP."""

from __future__ import annotations

import uuid
from typing import Any, cast

from marshmallow import Schema, fields, validate

from app.operations import ScheduleFields
from app.operations.schedules import Schedule, ScheduleSchema
from app.web.auth import authenticated, current_tenant
from app.web.batches import BatchListSchema
from app.web.blueprint import Blueprint, links_by_id
from app.web.context import services

blp = Blueprint("schedules", __name__, url_prefix="/schedules", description="Batch schedules")


def schedule_links(pointer: str = "/id") -> dict[str, Any]:
    """What a client does with a schedule it got: read, change or delete it, list its runs."""
    return links_by_id(
        pointer,
        GetSchedule="get /schedules/{schedule_id}",
        UpdateSchedule="patch /schedules/{schedule_id}",
        DeleteSchedule="delete /schedules/{schedule_id}",
        ScheduleRuns="get /schedules/{schedule_id}/runs",
    )


class InputSchema(Schema):
    file_id = fields.UUID(metadata={"description": "An uploaded file (POST /files)"})
    path = fields.String(
        validate=validate.Length(min=1, max=1000),
        metadata={"description": "A .npy/.jsonl file, or a folder of them (read in name "
                  "order), relative to your data area"},
    )  # fmt: skip


class ScheduleFieldsSchema(Schema):
    name = fields.String(validate=validate.Length(min=1, max=100))
    cron = fields.String(
        validate=validate.Length(min=1, max=120),
        metadata={"description": "Five fields (minute hour day month weekday), or six with "
                  "seconds last", "example": "0 3 * * *"},
    )  # fmt: skip
    timezone = fields.String(
        validate=validate.Length(min=1, max=64),
        metadata={"description": "IANA time zone the cron is read in", "example": "UTC"},
    )
    model = fields.String(metadata={"example": "digits"})
    version = fields.String(allow_none=True, metadata={"description": "None: the newest"})
    input = fields.Nested(InputSchema)
    output = fields.String(
        allow_none=True, validate=validate.Length(min=1, max=1000),
        metadata={"description": "A folder of your data area each run's results are written "
                  "to (<name>-<tick>.npy, or .jsonl when some rows failed); none: read them "
                  "from the run's batch"},
    )  # fmt: skip
    paused = fields.Boolean(metadata={"description": "A paused schedule does not fire"})


class CreateScheduleSchema(ScheduleFieldsSchema):
    class Meta:
        fields_required = ("name", "cron", "model", "input")

    def on_bind_field(self, field_name: str, field_obj: fields.Field) -> None:
        field_obj.required = field_name in self.Meta.fields_required


class ScheduleListSchema(Schema):
    items = fields.List(fields.Nested(ScheduleSchema))


class RunsArgsSchema(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))


@blp.post("")
@blp.response(201, ScheduleSchema, links=schedule_links())
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model or file")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Bad cron, zone or path")
@authenticated
@blp.arguments(CreateScheduleSchema())
def create_schedule(body: dict[str, Any]) -> tuple[Schedule, int, dict[str, str]]:
    schedule = services().schedules.create(current_tenant(), cast(ScheduleFields, body))
    return schedule, 201, {"Location": f"/schedules/{schedule.id}"}


@blp.get("")
@blp.response(200, ScheduleListSchema, links=schedule_links("/items/0/id"))
@authenticated
def list_schedules() -> dict[str, Any]:
    return {"items": services().schedules.list_schedules(current_tenant())}


@blp.get("/<uuid:schedule_id>")
@blp.response(200, ScheduleSchema, links=schedule_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such schedule for this tenant")
@authenticated
def get_schedule(schedule_id: uuid.UUID) -> Schedule:
    return services().schedules.get(current_tenant(), schedule_id)


@blp.patch("/<uuid:schedule_id>")
@blp.response(200, ScheduleSchema, links=schedule_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such schedule for this tenant")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Bad cron, zone or path")
@authenticated
@blp.arguments(ScheduleFieldsSchema())
def update_schedule(changes: dict[str, Any], schedule_id: uuid.UUID) -> Schedule:
    return services().schedules.update(current_tenant(), schedule_id, cast(ScheduleFields, changes))


@blp.delete("/<uuid:schedule_id>")
@blp.response(204)
@blp.alt_response(404, response="NOT_FOUND", description="No such schedule for this tenant")
@authenticated
def delete_schedule(schedule_id: uuid.UUID) -> None:
    services().schedules.delete(current_tenant(), schedule_id)


@blp.get("/<uuid:schedule_id>/runs")
@blp.response(200, BatchListSchema, description="Its runs, newest tick first: each a batch")
@blp.alt_response(404, response="NOT_FOUND", description="No such schedule for this tenant")
@authenticated
@blp.arguments(RunsArgsSchema(), location="query")
def schedule_runs(args: dict[str, Any], schedule_id: uuid.UUID) -> dict[str, Any]:
    runs = services().schedules.runs(current_tenant(), schedule_id, args["limit"])
    return {"items": services().batches.describe(runs)}
