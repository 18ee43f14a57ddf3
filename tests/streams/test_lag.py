"""Each binding's lag in /metrics and on the status page, read from Redis and
PostgreSQL when asked (no consumer runs here: the test plays one)."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask

from app.platform.database import Database
from app.platform.logstreams import RedisLogs
from app.tenancy.keys import create_operator_key
from tests.conftest import TenantAuth
from tests.streams.conftest import bind, produce, request


def test_lag_pending_and_unpublished_per_binding_in_metrics_and_on_the_status_page(
    make_app: Callable[..., Flask], tenant: TenantAuth, database: Database, logs: RedisLogs
) -> None:
    app = make_app(status_cache_seconds=0)
    client = app.test_client()
    binding = bind(client, tenant, input="lagging", output="lagging-out")
    group = "inference-jobs"
    logs.ensure_group(binding["input"], group)
    produce(logs, binding["input"], [request(i) for i in range(5)])
    logs.read_new(group, "a-consumer", [binding["input"]], 2, 0.05)  # 2 read, 3 not

    scraped = client.get("/metrics").get_data(as_text=True)
    labels = f'{{stream="{binding["input"]}",tenant="{tenant.name}"}}'
    assert f"inference_stream_lag{labels} 3.0" in scraped
    assert f"inference_stream_pending{labels} 2.0" in scraped
    assert f"inference_stream_unpublished{labels} 0.0" in scraped
    assert "inference_streams_up 1.0" in scraped
    assert f"inference_stream_lag_seconds{labels}" in scraped

    public = client.get("/status.json").json
    assert "stream_bindings" not in public  # log names name tenants: totals only
    assert public["streams"]["bindings"] >= 1 and public["streams"]["lag"] >= 3
    with database.sessionmaker.begin() as session:
        key = create_operator_key(session)
    operator = {"Authorization": f"Bearer {key}"}
    body = client.get("/status.json", headers=operator).json
    [line] = [s for s in body["stream_bindings"] if s["id"] == binding["id"]]
    assert (line["lag"], line["pending"], line["unpublished"]) == (3, 2, 0)
    assert line["tenant"] == tenant.name and line["input"] == binding["input"]
    page = client.get("/", headers=operator).get_data(as_text=True)
    assert f'data-stream="{binding["input"]}"' in page and 'data-metric="stream-lag"' in page
    assert binding["input"] not in client.get("/").get_data(as_text=True)
