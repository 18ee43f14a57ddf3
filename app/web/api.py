"""The HTTP API: flask-smorest blueprints, OpenAPI at /openapi.json, Swagger UI at /docs."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, Response
from flask_smorest import Api as SmorestApi
from swagger_ui_bundle import swagger_ui_path
from werkzeug.exceptions import HTTPException

from app.web.auth import SECURITY_SCHEME
from app.web.context import container_of
from app.web.problems import PROBLEM_JSON, problem_from_http_exception, problem_response
from app.web.schemas import ProblemSchema


class Api(SmorestApi):
    """flask-smorest with every HTTP error answered, and documented, as RFC 9457
    problem+json."""

    ERROR_SCHEMA = ProblemSchema

    def _register_responses(self) -> None:
        self.DEFAULT_RESPONSE_CONTENT_TYPE = PROBLEM_JSON
        try:
            super()._register_responses()
        finally:
            del self.DEFAULT_RESPONSE_CONTENT_TYPE

    def handle_http_exception(self, error: HTTPException) -> Response:
        return problem_response(problem_from_http_exception(error))


def register_api(app: Flask) -> None:
    from app.web import (  # fmt: skip
        batches,
        dead_letters,
        deliveries,
        files,
        health,
        infer,
        jobs,
        model_repository,
        openai,
        openai_batches,
        openai_responses,
        schedules,
        streams,
        usage,
    )
    from app.web import metrics_endpoint as metrics
    from app.web import model_metadata as models
    from app.web import status_page as status

    config: dict[str, Any] = {
        "API_TITLE": "Inference jobs",
        "API_VERSION": "0.1.0",
        "OPENAPI_VERSION": "3.0.3",
        "OPENAPI_URL_PREFIX": "/",
        "OPENAPI_JSON_PATH": "openapi.json",
        "OPENAPI_SWAGGER_UI_PATH": "/docs",
        "OPENAPI_SWAGGER_UI_URL": "/docs/assets/",
        "API_SPEC_OPTIONS": {
            "info": {
                "description": "Submit inference jobs, follow them, read their results. "
                "Errors are RFC 9457 application/problem+json."
            },
        },
    }
    app.config.update(config)
    api = Api(app)
    api.spec.components.security_scheme("bearerAuth", SECURITY_SCHEME)
    blueprints = (
        jobs.blp, infer.blp, batches.blp, files.blp, schedules.blp, streams.blp, deliveries.blp,
        deliveries.urls_blp, dead_letters.blp, usage.blp, models.blp, model_repository.blp,
        health.blp, status.blp, metrics.blp,
    )  # fmt: skip
    for blueprint in blueprints:
        api.register_blueprint(blueprint)
    app.extensions["api"] = api
    # The status page at / and its sign-in form: HTML for people, outside the
    # OpenAPI document (its JSON twin, /status.json, is in it).
    status.init_sessions(app, container_of(app).settings)
    app.register_blueprint(status.pages)
    # The OpenAI-compatible door (/v1), described by OpenAI's reference, not ours.
    app.register_blueprint(openai.blp)
    app.register_blueprint(openai_batches.blp)
    app.register_blueprint(openai_responses.blp)
    # Swagger UI's JavaScript and CSS from the installed package, not a CDN.
    app.register_blueprint(
        Blueprint(
            "swagger_ui",
            __name__,
            static_folder=str(swagger_ui_path),
            static_url_path="/docs/assets",
        )
    )
