"""A schedule as clients see it: the API and `manage.py schedules` both show this."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields

from app.schedules.tables import Schedule


class ScheduleSchema(Schema):
    id = fields.UUID()
    name = fields.String()
    cron = fields.String()
    timezone = fields.String()
    model = fields.String()
    version = fields.String(attribute="model_version", allow_none=True)
    input = fields.Method("get_input")
    output = fields.String(attribute="output_path", allow_none=True)
    paused = fields.Boolean()
    next_run_at = fields.DateTime(metadata={"description": "The next tick (UTC)"})
    last_run_at = fields.DateTime(allow_none=True)
    created_at = fields.DateTime()
    updated_at = fields.DateTime()
    runs_url = fields.Function(lambda s: f"/schedules/{s.id}/runs")

    def get_input(self, schedule: Schedule) -> dict[str, Any]:
        if schedule.input_file_id is not None:
            return {"file_id": str(schedule.input_file_id)}
        return {"path": schedule.input_path}
