"""/jobs: submit a job, read it, wait for it, stream its events, cancel it.
Handlers only translate HTTP to the job operations' requests and back."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Response, request, stream_with_context
from marshmallow import ValidationError

from app.errors import DomainError, InvalidRequest, MalformedRequest, TooManyWaits
from app.observability import tracing
from app.operations import JobQuery, JobRequest, Wait, Webhook
from app.operations.jobs import Job, Page, deadline
from app.platform.settings import Settings
from app.statuses import TERMINAL
from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint, links_by_id
from app.web.context import services
from app.web.event_stream import job_event_stream
from app.web.problem_types import problem
from app.web.problems import flatten
from app.web.schemas import (
    MAX_BULK_JOBS,
    BulkSubmitSchema,
    BulkSubmittedSchema,
    EventStreamArgsSchema,
    GetJobArgsSchema,
    JobPageSchema,
    JobSchema,
    ListJobsArgsSchema,
    SubmitHeadersSchema,
    SubmitJobSchema,
)

blp = Blueprint("jobs", __name__, url_prefix="/jobs", description="Asynchronous inference jobs")


def job_links(pointer: str = "/id") -> dict[str, Any]:
    """What a client does with a job it got: read it, cancel it, follow its events,
    read its webhook deliveries."""
    return links_by_id(
        pointer,
        GetJob="get /jobs/{job_id}",
        CancelJob="post /jobs/{job_id}/cancel",
        JobEvents="get /jobs/{job_id}/events",
        JobDeliveries="get /jobs/{job_id}/deliveries",
    )


@blp.post("")
@authenticated
@blp.arguments(SubmitJobSchema())
@blp.arguments(SubmitHeadersSchema(), location="headers")
@blp.response(202, JobSchema, description="Accepted; poll the Location URL", links=job_links())
@blp.alt_response(200, schema=JobSchema, description="Finished within `Prefer: wait=N`",
                  links=job_links())  # fmt: skip
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model")
@blp.alt_response(409, response="CONFLICT", description="Same Idempotency-Key still in flight")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Inputs do not fit")
@blp.alt_response(429, response="TOO_MANY_REQUESTS", description="A queue or quota is full")
def submit(body: dict[str, Any], headers_in: dict[str, Any]) -> tuple[Job, int, dict[str, str]]:
    job = services().jobs.submit(
        current_tenant(),
        job_request(body, headers_in.get("cancel_after"), headers_in.get("idempotency_key")),
    )
    headers = {"Location": f"/jobs/{job.id}"}
    wait = preferred_wait(headers_in.get("prefer"), services().settings)
    if wait is None:
        return job, 202, headers
    try:
        job = services().jobs.wait(current_tenant(), job.id, Wait(wait, until="finished"))
    except TooManyWaits:
        return job, 202, headers  # the job is accepted all the same: no wait, as RFC 7240 allows
    headers["Preference-Applied"] = f"wait={wait:g}"
    return job, 200 if job.status in TERMINAL else 202, headers


def job_request(
    body: dict[str, Any], cancel_after: float | None, idempotency_key: str | None
) -> JobRequest:
    webhook = body["webhook"]
    return JobRequest(
        body["model"], body["inputs"], version=body["version"], priority=body["priority"],
        parameters=body.get("parameters"), deadline=deadline(body["deadline"], cancel_after),
        idempotency_key=idempotency_key,
        webhook=Webhook(webhook["url"], tuple(webhook["events"])) if webhook else None,
        traceparent=tracing.valid(request.headers.get(tracing.TRACEPARENT)),
    )  # fmt: skip


@blp.post("/bulk")
@authenticated
@blp.arguments(BulkSubmitSchema())
@blp.response(202, BulkSubmittedSchema, description="Each item's job or its problem, in order",
              links=job_links("/jobs/0/id"))  # fmt: skip
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Not a list of 1 to "
                  f"{MAX_BULK_JOBS} objects")  # fmt: skip
def submit_bulk(body: dict[str, Any]) -> dict[str, Any]:
    """Many jobs in one request: one INSERT and one wake-up per model. An item that
    cannot be accepted (bad inputs, an unknown model, a full queue or quota) is
    answered with its own problem object; the others are accepted all the same."""
    items: list[Job | dict[str, Any] | None] = [None] * len(body["jobs"])
    requests: list[JobRequest] = []
    places: list[int] = []
    for index, item in enumerate(body["jobs"]):
        try:
            if isinstance(item, ValidationError):
                raise InvalidRequest("; ".join(flatten(item.messages)), errors=item.messages)
            requests.append(job_request(item, item["cancel_after"], item["idempotency_key"]))
            places.append(index)
        except DomainError as exc:
            items[index] = item_problem(exc, index)
    outcomes = services().jobs.submit_many(current_tenant(), requests)
    for index, outcome in zip(places, outcomes, strict=True):
        items[index] = item_problem(outcome, index) if isinstance(outcome, DomainError) else outcome
    refused = sum(isinstance(item, dict) for item in items)
    return {"jobs": items, "accepted": len(items) - refused, "refused": refused}


def item_problem(exc: DomainError, index: int) -> dict[str, Any]:
    return {**problem(exc, request.path), "index": index}


def preferred_wait(prefer: str | None, settings: Settings) -> float | None:
    """Seconds from `Prefer: wait=N` (RFC 7240), capped; None when absent or not
    an integer, which the RFC says to ignore (no Preference-Applied then)."""
    for preference in (prefer or "").split(","):
        name, _, value = preference.split(";")[0].strip().partition("=")
        if name.strip().lower() == "wait" and value.strip().isascii() and value.strip().isdigit():
            return min(float(value.strip()), settings.max_wait_seconds)
    return None


@blp.get("")
@authenticated
@blp.arguments(ListJobsArgsSchema(), location="query")
@blp.response(200, JobPageSchema, links=job_links("/items/0/id"))
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Bad filter or cursor")
def list_jobs(args: dict[str, Any]) -> Page:
    outputs = args.pop("include", None) == "outputs"
    return services().jobs.list_jobs(current_tenant(), JobQuery(**args, outputs=outputs))


@blp.post("/<uuid:job_id>/cancel")
@blp.delete("/<uuid:job_id>", endpoint="delete_job")
@blp.response(200, JobSchema, description="Cancelled, or (still running) cancel requested",
              links=job_links())  # fmt: skip
@blp.alt_response(404, response="NOT_FOUND", description="No such job for this tenant")
@blp.alt_response(409, response="CONFLICT", description="The job has already finished")
@authenticated
def cancel_job(job_id: uuid.UUID) -> Job:
    """Cancel the job (DELETE /jobs/<id> is the same call, the verb Replicate-style
    and REST clients use): a queued job at once, a running one before its result
    is written; the record stays, with what a running generation made so far."""
    return services().jobs.cancel(current_tenant(), job_id)


@blp.get("/<uuid:job_id>")
@authenticated
@blp.arguments(GetJobArgsSchema(), location="query")
@blp.response(200, JobSchema, links=job_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such job for this tenant")
def get_job(args: dict[str, Any], job_id: uuid.UUID) -> Job:
    return services().jobs.wait(current_tenant(), job_id, Wait(args["wait"], until="change"))


@blp.get("/<uuid:job_id>/events")
@authenticated
@blp.arguments(EventStreamArgsSchema(), location="query")
@blp.doc(
    responses={
        "200": {
            "description": "Server-Sent Events, one per state change; the "
            "stream ends after the terminal event",
            "content": {"text/event-stream": {}},
        }
    }
)
@blp.alt_response(404, response="NOT_FOUND", description="No such job for this tenant")
def job_events(args: dict[str, Any], job_id: uuid.UUID) -> Response:
    header = request.headers.get("Last-Event-ID", "").strip()
    if header and not (header.isascii() and header.isdigit()):
        services().jobs.get(current_tenant(), job_id)  # 404 before anything else
        raise MalformedRequest(
            f"Last-Event-ID {header[:40]!r} is not an event id; send the id of the last "
            "event received (digits), or no header to start from the first event",
            errors={"Last-Event-ID": ["a non-negative integer"]},
        )
    after = int(header) if header else args.get("last_event_id", 0)
    release = services().jobs.follow(current_tenant(), job_id, after)
    if release is None:
        return Response(status=204)  # all was sent: EventSource stops reconnecting on a 204
    stream = job_event_stream(services().jobs, job_id, after, release)
    return Response(
        stream_with_context(stream),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
