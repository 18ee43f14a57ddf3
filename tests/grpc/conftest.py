"""The gRPC door, served in this process on a free loopback port over the test
run's database, Redis and real worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tritonclient.grpc as triton

from app.container import Container
from app.grpc.server import Running, door_settings, start
from app.platform.settings import Settings


@pytest.fixture(scope="module")
def grpc_server(settings: Settings) -> Iterator[Running]:
    running = start(Container(door_settings(settings)), "127.0.0.1", 0)
    yield running
    running.stop(0)
    running.container.close()


@pytest.fixture
def serve_grpc(settings: Settings) -> Iterator[Callable[..., Running]]:
    """`serve_grpc(**overrides)`: a server of its own settings for one test."""
    servers: list[Running] = []

    def make(**overrides: Any) -> Running:
        own = door_settings(settings).with_overrides(**overrides)
        servers.append(start(Container(own), "127.0.0.1", 0))
        return servers[-1]

    yield make
    for running in servers:
        running.stop(0)
        running.container.close()


@pytest.fixture
def triton_client(grpc_server: Running) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    yield client
    client.close()


class FailsOnce:
    """A data-plane method that raises an error of the service's own (never a
    DomainError) on its first call, then does what it did before: the unexpected
    failure a bug or a lost dependency makes, in the running server."""

    SECRET = "secret detail: /srv/models/digits.onnx at 0xdeadbeef"
    INTERNALS = ("secret", "deadbeef", "RuntimeError", "Traceback", "/srv/")

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method, self.calls = method, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError(self.SECRET)
        return self.method(*args, **kwargs)
