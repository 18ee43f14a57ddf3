"""The operations raise plain domain errors, usable without an HTTP request (beat,
the CLI, batch code, other doors); the edge maps them to problem+json
(tests/api/test_errors.py)."""

from __future__ import annotations

import uuid

import pytest
from flask import Flask

from app.errors import Conflict, InputsDoNotFit, InvalidRequest, NotFound, UnknownModel
from app.operations import JobQuery, JobRequest
from app.platform.database import Database
from app.web.context import container_of
from tests.conftest import TenantAuth, insert_queued_job


def test_services_raise_domain_errors_outside_a_request(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    container = container_of(app)
    plane = container
    with container.scope():
        with pytest.raises(NotFound, match="no job with id"):
            plane.jobs.get(tenant.ref, uuid.uuid4())
        with pytest.raises(UnknownModel) as unknown:
            plane.jobs.submit(tenant.ref, JobRequest("nope", {}))
        assert "digits" in unknown.value.known
        with pytest.raises(InputsDoNotFit) as misfit:
            plane.jobs.submit(tenant.ref, JobRequest("digits", {"pixels": [[1.0]]}))
        assert "pixels" in misfit.value.extra["errors"]
        assert misfit.value.extra["expected"][0]["shape"] == [-1, 64]
        with pytest.raises(InvalidRequest, match="cursor"):
            plane.jobs.list_jobs(tenant.ref, JobQuery(limit=1, cursor="not-a-cursor"))
    with container.scope():
        job_id = insert_queued_job(database, tenant.id)
        plane.jobs.cancel(tenant.ref, job_id)
        with pytest.raises(Conflict) as conflict:
            plane.jobs.cancel(tenant.ref, job_id)
        assert conflict.value.extra["job_status"] == "cancelled"
