"""OpenAI's Responses API, durable: /v1/responses.

`POST /v1/responses` creates a response (a generation job with its record):
with `background: true` it answers at once, `queued`; with `stream: true` it
answers Server-Sent Events (OpenAI's `response.*` events, each with its
`sequence_number`); otherwise it waits for the whole answer. `GET
/v1/responses/<id>` polls it (`?stream=true&starting_after=N` resumes its stream
after event N, from the record), `POST .../cancel` stops a background one,
`DELETE` forgets it, `GET .../input_items` lists what it was asked. The official
`openai` client's `responses.create/retrieve/cancel/delete/stream` work as they
are. A webhook (the extra field `webhook: {"url", "events"}`) gets the job's
events. Errors are OpenAI's error object, as at the rest of /v1.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from app.operations.responses import (
    BadField,
    Followed,
    ResponseEvents,
    job_id_of,
    read_create,
    response_object,
)
from app.web.auth import authenticated, current_tenant
from app.web.context import services
from app.web.openai import invalid, json_body
from app.web.problems import Problem

blp = Blueprint("openai_responses", __name__, url_prefix="/v1")


def _job(value: str) -> uuid.UUID:
    found = job_id_of(value)
    if found is None:
        raise Problem("not-found", f"no response {value}", status=404)
    return found


@blp.post("/responses")
@authenticated
def create() -> Response | dict[str, Any]:
    """Create a response: whole, streamed, or in the background."""
    tenant, operations = current_tenant(), services().openai.responses
    try:
        ask = read_create(json_body())
        job = operations.create(tenant, ask)
    except BadField as exc:
        raise invalid(exc.param, exc.message) from None
    if ask.stream:
        # A background response goes on if its stream is dropped; another is cancelled.
        live = operations.follow(tenant, job.id)
        return _stream(job.id, live, -1, cancel_if_left=not ask.background)
    if not ask.background:
        for followed in operations.follow(tenant, job.id):
            if followed.final is not None:
                break
    return response_object(operations.shown(tenant, job.id))


@blp.get("/responses/<response_id>")
@authenticated
def retrieve(response_id: str) -> Response | dict[str, Any]:
    """The response as it stands; with `stream=true`, its events (after `starting_after`)."""
    job_id, tenant = _job(response_id), current_tenant()
    shown = services().openai.responses.shown(tenant, job_id)
    if request.args.get("stream", "false").lower() != "true":
        return response_object(shown)
    after = request.args.get("starting_after", "-1")
    if not after.lstrip("-").isdigit():
        raise invalid("starting_after", "expected an event's sequence_number")
    replayed = services().openai.responses.replay(tenant, job_id)
    return _stream(job_id, replayed, int(after), cancel_if_left=False)


@blp.post("/responses/<response_id>/cancel")
@authenticated
def cancel(response_id: str) -> dict[str, Any]:
    """Stop a background response; it ends `cancelled` with the text made so far."""
    try:
        shown = services().openai.responses.cancel(current_tenant(), _job(response_id))
    except BadField as exc:
        raise invalid(exc.param, exc.message) from None
    return response_object(shown)


@blp.delete("/responses/<response_id>")
@authenticated
def delete(response_id: str) -> dict[str, Any]:
    """Forget a response (an unfinished one is stopped first)."""
    services().openai.responses.delete(current_tenant(), _job(response_id))
    return {"id": response_id, "object": "response", "deleted": True}


@blp.get("/responses/<response_id>/input_items")
@authenticated
def input_items(response_id: str) -> dict[str, Any]:
    """What the response was asked: its own input items (`order` asc or desc)."""
    items = services().openai.responses.input_items(current_tenant(), _job(response_id))
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", 'expected "asc" or "desc"')
    if order == "desc":
        items.reverse()
    after = request.args.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    limit = request.args.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise invalid("limit", "expected an integer from 1 to 100")
    page = items[: int(limit)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page)}  # fmt: skip


def _stream(
    job_id: uuid.UUID, followed: Iterator[Followed], after: int, *, cancel_if_left: bool
) -> Response:
    tenant, operations = current_tenant(), services().openai.responses
    events = ResponseEvents(job_id, after)

    def sse(event: dict[str, Any]) -> str:
        return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"

    def body() -> Iterator[str]:
        finished = False
        try:
            yield from map(sse, events.opening(operations.shown(tenant, job_id)))
            for piece in followed:
                yield from map(sse, events.delta(piece.text))
                if piece.final is not None:
                    finished = True
                    yield from map(sse, events.closing(operations.shown(tenant, job_id)))
        finally:
            if not finished and cancel_if_left:
                services().openai.completions.cancel(tenant, job_id)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Job-Id": str(job_id)}
    return Response(stream_with_context(body()), mimetype="text/event-stream", headers=headers)
