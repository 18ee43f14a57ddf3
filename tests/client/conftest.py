"""The service over real HTTP on loopback (werkzeug in a thread, the run's real
workers behind it), for the Python client."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from app import create_app
from app.platform.settings import Settings
from inference_client import Client
from tests.conftest import TenantAuth
from tests.support import live_server

CHUNKED = "digits-chunked"  # digits cut into chunk jobs of 16 rows: batches of several chunks


@pytest.fixture(scope="session")
def client_app(settings: Settings, model_repository: Path) -> Flask:
    chunked = model_repository / CHUNKED / "1"
    if not chunked.exists():
        shutil.copytree(model_repository / "digits" / "1", chunked)
        card = json.loads((chunked / "card.json").read_text())
        (chunked / "card.json").write_text(json.dumps({**card, "batch_chunk_rows": 16}))
    return create_app(settings)


@pytest.fixture(scope="session")
def base_url(client_app: Flask) -> Iterator[str]:
    with live_server(client_app) as server:
        yield server.url


def key_of(tenant: TenantAuth) -> str:
    return tenant.headers["Authorization"].removeprefix("Bearer ")


@pytest.fixture
def api_key(tenant: TenantAuth) -> str:
    return key_of(tenant)


@pytest.fixture
def api(base_url: str, api_key: str) -> Iterator[Client]:
    with Client(base_url, api_key, timeout=30) as client:
        yield client
