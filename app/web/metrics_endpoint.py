"""GET /metrics: Prometheus text of the API processes, the queue gauges read from
PostgreSQL and the stream bindings' lag (see app.observability.metrics for which
metric comes from where)."""

from __future__ import annotations

from flask import Response, request

from app.observability import metrics
from app.web.blueprint import Blueprint
from app.web.context import services
from app.web.problems import Problem

blp = Blueprint("metrics", __name__, description="Prometheus metrics")


@blp.get("/metrics")
@blp.doc(
    responses={
        "200": {
            "description": "Prometheus text format: the API processes' counters, the "
            "queue gauges and the stream gauges. With METRICS_TOKEN set, needs "
            "`Authorization: Bearer <token>`.",
            "content": {"text/plain": {}},
        }
    }
)
@blp.alt_response(401, response="UNAUTHORIZED", description="METRICS_TOKEN is set; not sent")
def scrape() -> Response:
    settings = services().settings
    if not metrics.authorized(request.headers.get("Authorization"), settings.metrics_token):
        raise Problem(
            "unauthorized",
            "this service's metrics need `Authorization: Bearer <METRICS_TOKEN>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Response(services().status.metrics(), content_type=metrics.CONTENT_TYPE)
