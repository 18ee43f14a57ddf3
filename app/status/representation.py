"""The status as JSON (`GET /status.json`), and its schema for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields

from app.status.service import DEAD_LETTER_CAP, LetterLine, ModelLine, Status


class ModelLineSchema(Schema):
    model = fields.String(
        allow_none=True,
        metadata={"description": "null: the models not open to every tenant, together "
                  "(their names are shown to operators only)"},
    )  # fmt: skip
    queued = fields.Integer()
    oldest_queued_seconds = fields.Float(
        allow_none=True, metadata={"description": "Since the oldest queued job was submitted"}
    )
    running = fields.Integer()
    succeeded = fields.Integer(metadata={"description": "Finished in the window"})
    failed = fields.Integer()
    cancelled = fields.Integer()
    expired = fields.Integer()


class WorkerSchema(Schema):
    hostname = fields.String()
    queues = fields.List(fields.String())


class WorkersSchema(Schema):
    reachable = fields.Boolean(metadata={"description": "false: the broker did not answer"})
    online = fields.Integer(
        metadata={"description": "Workers serving the service's queues that answered a 1 s census"}
    )
    queues = fields.Dict(
        keys=fields.String(),
        values=fields.Integer(),
        metadata={"description": "Workers consuming each of the service's queues"},
    )
    hosts = fields.List(fields.Nested(WorkerSchema), metadata={"description": "Operators only"})


class DeadLetterLineSchema(Schema):
    id = fields.Integer()
    kind = fields.String(metadata={"description": "job: a failed job; webhook: undeliverable"})
    job_id = fields.UUID(allow_none=True)
    batch_id = fields.UUID(allow_none=True)
    tenant = fields.String()
    model = fields.String()
    model_version = fields.String()
    error_code = fields.String()
    error_class = fields.String()
    message = fields.String(metadata={"description": "At most 300 characters"})
    attempts = fields.Integer()
    last_failed_at = fields.DateTime()
    replayed_at = fields.DateTime(allow_none=True)


class StatusSchema(Schema):
    """Aggregate numbers for anyone; the newest dead letters and the workers'
    names for an operator (`Authorization: Bearer <operator key>`)."""

    as_of = fields.DateTime()
    window_seconds = fields.Float(metadata={"description": "The window of the finished counts"})
    models = fields.List(fields.Nested(ModelLineSchema))
    totals = fields.Nested(ModelLineSchema)
    dead_letters_open = fields.Integer(
        metadata={"description": f"Not replayed; counted up to {DEAD_LETTER_CAP + 1}"}
    )
    workers = fields.Nested(WorkersSchema)
    links = fields.Dict(keys=fields.String(), values=fields.String(allow_none=True))
    operator = fields.Boolean(metadata={"description": "Whether the operator view is shown"})
    dead_letters = fields.List(
        fields.Nested(DeadLetterLineSchema),
        metadata={"description": "Operators only: the newest 20"},
    )


def _line(line: ModelLine) -> dict[str, Any]:
    return {
        "model": line.model,
        "queued": line.queued,
        "oldest_queued_seconds": line.oldest_queued_s,
        "running": line.running,
        **line.finished,
    }


def _letter(letter: LetterLine) -> dict[str, Any]:
    return {name: getattr(letter, name) for name in DeadLetterLineSchema().fields}


def status_dict(status: Status, links: dict[str, str | None]) -> dict[str, Any]:
    snap, census = status.snapshot, status.snapshot.census
    workers: dict[str, Any] = {
        "reachable": census.reachable,
        "online": census.online,
        "queues": {queue: census.serving(queue) for queue in census.queues},
    }
    body: dict[str, Any] = {
        "as_of": snap.at,
        "window_seconds": snap.window_s,
        "models": [_line(line) for line in snap.models],
        "totals": _line(snap.totals),
        "dead_letters_open": snap.open_dead_letters,
        "workers": workers,
        "links": links,
        "operator": status.operator,
    }
    if status.operator:
        workers["hosts"] = [{"hostname": h, "queues": q} for h, q in census.workers.items()]
        body["dead_letters"] = [_letter(letter) for letter in status.letters]
    return body
