"""/jobs: submit a job, read it, list them. Handlers only translate HTTP."""

from __future__ import annotations

import uuid
from typing import Any

from flask import current_app
from flask_smorest import Blueprint

from app.api.schemas import (
    JobPageSchema,
    JobSchema,
    ListJobsArgsSchema,
    SubmitHeadersSchema,
    SubmitJobSchema,
)
from app.auth import authenticated, current_tenant
from app.db.models import Job
from app.db.session import current_session
from app.jobs import service

blp = Blueprint("jobs", __name__, url_prefix="/jobs", description="Asynchronous inference jobs")


@blp.post("")
@blp.arguments(SubmitJobSchema)
@blp.arguments(SubmitHeadersSchema, location="headers")
@blp.response(202, JobSchema, description="Accepted; poll the Location URL")
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Inputs do not fit")
@authenticated
def submit(body: dict[str, Any], headers: dict[str, Any]) -> tuple[Job, int, dict[str, str]]:
    job = service.submit(
        current_session(),
        current_app.extensions["models"],
        current_tenant().id,
        body["model"],
        body["version"],
        body["inputs"],
        max_attempts=current_app.extensions["settings"].job_max_attempts,
        deadline=service.deadline(body["deadline"], headers.get("cancel_after")),
    )
    return job, 202, {"Location": f"/jobs/{job.id}"}


@blp.get("")
@blp.arguments(ListJobsArgsSchema, location="query")
@blp.response(200, JobPageSchema)
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Bad filter or cursor")
@authenticated
def list_jobs(args: dict[str, Any]) -> service.Page:
    return service.list_jobs(current_session(), current_tenant().id, **args)


@blp.post("/<uuid:job_id>/cancel")
@blp.response(200, JobSchema, description="Cancelled, or (still running) cancel requested")
@blp.alt_response(404, response="NOT_FOUND", description="No such job for this tenant")
@blp.alt_response(409, response="CONFLICT", description="The job has already finished")
@authenticated
def cancel_job(job_id: uuid.UUID) -> Job:
    return service.cancel(current_session(), current_tenant().id, job_id)


@blp.get("/<uuid:job_id>")
@blp.response(200, JobSchema)
@blp.alt_response(404, response="NOT_FOUND", description="No such job for this tenant")
@authenticated
def get_job(job_id: uuid.UUID) -> Job:
    return service.get(current_session(), current_tenant().id, job_id)
