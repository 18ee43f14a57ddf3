"""Schemathesis against /openapi.json, as a new user would try the API: generated
requests to every operation, with a tenant's key. No response may be a 5xx,
every response must match the documented schema, and every error must be
problem+json. The number of examples per operation is bounded (CI time)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis import checks

from app import create_app
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import make_tenant

EXAMPLES = 40
CHECKS = [checks.not_a_server_error, checks.response_schema_conformance,
          checks.content_type_conformance, checks.status_code_conformance]  # fmt: skip


@pytest.fixture(scope="module")
def contract_app(settings: Settings) -> Iterator[Flask]:
    # Its own queue, which no worker reads: what generated requests submit stays queued.
    app = create_app(settings.with_overrides(jobs_queue=f"contract-{uuid.uuid4().hex}"))
    yield app
    container_of(app).database.engine.dispose()


@pytest.fixture(scope="module")
def api_schema(contract_app: Flask) -> Any:
    return schemathesis.openapi.from_wsgi("/openapi.json", contract_app)


@pytest.fixture(scope="module")
def auth(database: Database) -> dict[str, str]:
    return make_tenant(database).headers


def test_generated_requests_get_no_server_error_and_match_the_schema(
    api_schema: Any, auth: dict[str, str]
) -> None:
    failures: list[str] = []
    operations = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None,
                             suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            response = case.call(headers={**(case.headers or {}), **auth})
            where = f"{case.method} {case.formatted_path} -> {response.status_code}"
            if response.status_code >= 500:
                failures.append(f"{where}: {response.text[:300]}")
            media = _header(response.headers, "content-type")
            if response.status_code >= 400 and not media.startswith("application/problem+json"):
                failures.append(f"{where}: not problem+json but {media!r}")
            try:  # the checks the API promises: no 5xx, responses as documented
                case.validate_response(response, checks=CHECKS)
            except BaseException as exc:  # schemathesis raises a group of named failures
                failures.append(f"{where}: {str(exc)[:300]}")

        run()
    assert operations > 20
    assert failures == [], "\n".join(failures[:20])


def _header(headers: Any, name: str) -> str:
    value = next((v for k, v in headers.items() if k.lower() == name), "")
    return str(value[0] if isinstance(value, list) else value)
