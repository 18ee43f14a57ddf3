"""Schemathesis against /openapi.json, as a new user would try the API: generated
requests to every operation, with a tenant's key. No response may be a 5xx,
every response must match the documented schema, and every error must be
problem+json. The number of examples per operation is bounded (CI time).

The stateful run chains calls along the description's links (create a job, a batch,
a file, a schedule, a binding, then read, change, cancel or delete it), with a fixed
seed and a bounded number of scenarios and steps; part of its creating requests are
steered to ones that succeed (tests/contract/steering.py), or there would be nothing
to follow."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Flaky
from schemathesis import checks

from app import create_app
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import make_tenant
from tests.contract import steering

EXAMPLES = 40
CHECKS = [checks.not_a_server_error, checks.response_schema_conformance,
          checks.content_type_conformance, checks.status_code_conformance]  # fmt: skip
# The stateful run: the seed, SCENARIOS scenarios of up to STEPS calls each.
SEED = 237557590500473225693516020137126274675
SCENARIOS, STEPS = 80, 12
ATTEMPTS = 10  # seeds tried, each for the scenarios still to run (see the loop)
STATEFUL_CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
                   checks.response_schema_conformance]  # fmt: skip


@pytest.fixture(scope="module")
def contract_app(settings: Settings) -> Iterator[Flask]:
    # Its own queue, which no worker reads: what generated requests submit stays queued.
    app = create_app(settings.with_overrides(jobs_queue=f"contract-{uuid.uuid4().hex}"))
    yield app
    container_of(app).parts.database.engine.dispose()


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


def test_stateful_chains_of_calls_along_the_links_get_no_server_error_and_match_the_schema(
    contract_app: Flask, auth: dict[str, str]
) -> None:
    schema = schemathesis.openapi.from_wsgi("/openapi.json", contract_app)
    schema.config.phases.stateful.inference.algorithms = []  # the description's links only
    # An event stream of a job no worker runs stays open (MAX_STREAM_S): not followed here.
    schema = schema.exclude(path="/jobs/{job_id}/events")
    steering.register(schema.hook)
    failures: list[str] = []
    counts: Counter[str] = Counter()

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            counts["scenarios"] += 1

        def step(self, input: Any) -> Any:
            counts["steps"] += 1
            if input.transition is not None and input.is_applied:
                counts["linked steps"] += 1
                counts[f"link {input.transition.id}"] += 1
            return super().step(input)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": {**(case.headers or {}), **auth}}

        def validate_response(self, response: Any, case: Any, *_: Any, **kwargs: Any) -> None:
            counts[f"{response.status_code // 100}xx"] += 1
            where = f"{case.method} {case.formatted_path} -> {response.status_code}"
            try:
                case.validate_response(
                    response,
                    checks=STATEFUL_CHECKS,
                    transport_kwargs=kwargs or None,
                    recorder=self.recorder,
                )
            except BaseException as exc:  # a group of named failures
                failures.append(f"{where}: {str(exc)[:400]}")

    for attempt in range(ATTEMPTS):
        # The API's state differs between scenarios (a name taken, a binding made), so
        # Hypothesis may find a replayed scenario drawing differently and stop (Flaky), as
        # schemathesis' own runner does; then the rest of the scenarios run on the next
        # seed, until SCENARIOS ran (the state the suite's other tests left varies).
        if counts["scenarios"] >= SCENARIOS:
            break
        bounded = hypothesis_settings(
            max_examples=SCENARIOS - counts["scenarios"], stateful_step_count=STEPS,
            deadline=None, database=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        try:
            seed(SEED + attempt)(Workflow).run(settings=bounded)
            break
        except Flaky:
            continue
    print(dict(sorted(counts.items())))
    assert failures == [], "\n".join(failures[:20])
    # It ran, and it followed links from resources it created, not only 404s.
    assert counts["scenarios"] >= SCENARIOS * 3 // 4
    assert counts["steps"] >= 3 * SCENARIOS
    assert counts["linked steps"] >= SCENARIOS // 2  # 77 to 146 seen, by what ran before
    assert counts["2xx"] >= counts["steps"] // 4
    followed = {name for name in counts if name.startswith("link ")}
    assert len(followed) >= 10, followed


def _header(headers: Any, name: str) -> str:
    value = next((v for k, v in headers.items() if k.lower() == name), "")
    return str(value[0] if isinstance(value, list) else value)
