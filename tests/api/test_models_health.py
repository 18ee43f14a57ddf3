"""Model metadata (ours and KServe v2), health checks, and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask
from flask.testing import FlaskClient

from app.platform.settings import Settings


def test_models_listing_describes_the_digits_model(client: FlaskClient) -> None:
    models = client.get("/models").json["models"]
    digits = next(m for m in models if m["name"] == "digits")
    assert digits["version"] == "1" and digits["versions"] == ["1"]
    assert digits["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert digits["labels"] == [str(d) for d in range(10)]
    assert digits["metrics"]["heldout_accuracy"] > 0.95


def test_kserve_v2_model_metadata(client: FlaskClient) -> None:
    body = client.get("/v2/models/digits").json
    assert body == {
        "name": "digits",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ],
    }
    assert client.get("/v2/models/digits/versions/1").json == body
    assert client.get("/v2/models/digits/ready").json["ready"] is True
    missing = client.get("/v2/models/nope")
    assert missing.status_code == 404 and missing.content_type == "application/problem+json"


def test_health(client: FlaskClient) -> None:
    assert client.get("/v2/health/live").status_code == 200
    ready = client.get("/v2/health/ready")
    assert ready.status_code == 200
    assert ready.json["checks"] == {"database": "ok", "redis": "ok", "models": "ok"}


def test_not_ready_when_redis_does_not_answer(
    settings: Settings, make_app: Callable[..., Flask]
) -> None:
    broken = make_app(settings.with_overrides(redis_url="redis://127.0.0.1:1/0"))
    response = broken.test_client().get("/v2/health/ready")
    assert response.status_code == 503
    assert response.content_type == "application/problem+json"
    assert response.headers["Retry-After"]
    assert response.json["checks"]["redis"].startswith("unreachable")
    assert response.json["checks"]["database"] == "ok"


def test_not_ready_without_models(
    settings: Settings, tmp_path: object, make_app: Callable[..., Flask]
) -> None:
    empty = make_app(settings.with_overrides(model_repository=tmp_path))
    response = empty.test_client().get("/v2/health/ready")
    assert response.status_code == 503
    assert "models build" in response.json["checks"]["models"]
    assert str(tmp_path) not in response.get_data(as_text=True)  # no path of the server


def test_openapi_and_docs(client: FlaskClient) -> None:
    spec = client.get("/openapi.json").json
    assert {"/jobs", "/jobs/{job_id}", "/models", "/v2/models/{name}", "/v2/health/ready"} <= set(
        spec["paths"]
    )
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert spec["paths"]["/jobs"]["post"]["security"] == [{"bearerAuth": []}]
    assert "security" not in spec["paths"]["/models"]["get"]
    responses = spec["components"]["responses"]
    for name in ("NOT_FOUND", "UNPROCESSABLE_ENTITY", "UNAUTHORIZED", "DEFAULT_ERROR"):
        assert list(responses[name]["content"]) == ["application/problem+json"], name
    job_responses = spec["paths"]["/jobs/{job_id}"]["get"]["responses"]
    assert {"200", "401", "404"} <= set(job_responses)
    assert set(spec["components"]["schemas"]["Problem"]["properties"]) >= {
        "type",
        "title",
        "detail",
    }
    assert "application/json" in spec["paths"]["/jobs"]["post"]["responses"]["202"]["content"]
    docs = client.get("/docs")
    assert docs.status_code == 200
    page = docs.get_data(as_text=True)
    # Served from the package, so the page works without internet access.
    assert "/docs/assets/swagger-ui-bundle.js" in page
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "swagger-ui-standalone-preset.js"):
        response = client.get(f"/docs/assets/{asset}")
        assert response.status_code == 200 and len(response.data) > 10_000
        response.close()
