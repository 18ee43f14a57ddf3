"""Services raise plain domain errors, usable without an HTTP request (beat, the
CLI, batch code); the edge maps them to problem+json (tests/api/test_errors.py)."""

from __future__ import annotations

import uuid

import pytest
from flask import Flask

from app.errors import Conflict, InputsDoNotFit, InvalidRequest, NotFound
from app.jobs import service
from app.models.registry import UnknownModel
from app.platform.database import Database
from tests.conftest import TenantAuth, insert_queued_job


def test_services_raise_domain_errors_outside_a_request(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    models = app.extensions["models"]
    with database.sessionmaker() as session:
        with pytest.raises(NotFound, match="no job with id"):
            service.get(session, tenant.id, uuid.uuid4())
        with pytest.raises(UnknownModel) as unknown:
            service.submit(session, models, tenant.id, "nope", None, {})
        assert "digits" in unknown.value.known
        with pytest.raises(InputsDoNotFit) as misfit:
            service.submit(session, models, tenant.id, "digits", None, {"pixels": [[1.0]]})
        assert "pixels" in misfit.value.extra["errors"]
        assert misfit.value.extra["expected"][0]["shape"] == [-1, 64]
        with pytest.raises(InvalidRequest, match="cursor"):
            service.list_jobs(session, tenant.id, limit=1, cursor="not-a-cursor")
    with app.app_context(), database.sessionmaker() as session:
        job_id = insert_queued_job(database, tenant.id)
        service.cancel(session, tenant.id, job_id)
        with pytest.raises(Conflict) as conflict:
            service.cancel(session, tenant.id, job_id)
        assert conflict.value.extra["job_status"] == "cancelled"
