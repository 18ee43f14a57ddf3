"""The gRPC server: the inference service and the standard health service.

`python -m app.grpc` runs it (`make run` starts it on GRPC_PORT, 8001 as
Triton's), over a container of its own like every other process. Threads,
not processes: calls wait on jobs (the workers own the models), and waiting
calls are bounded per tenant and in all (GRPC_MAX_WAITS_PER_TENANT,
GRPC_MAX_WAITS) below GRPC_THREADS, so health and metadata calls always find a thread.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from app.container import Container
from app.grpc.door import Door
from app.grpc.generated import grpc_service_pb2 as pb
from app.grpc.servicer import Servicer
from app.platform.settings import Settings

logger = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
HEALTH_CHECK_S = 5.0
KEEPALIVE_MS = 30_000


@dataclass
class Running:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    container: Container

    def check_health(self) -> bool:
        """SERVING while the service is ready (database, broker, a model), for the
        whole server ("") and the inference service alike."""
        try:
            with self.container.scope():
                checks = self.container.status.readiness()
            ready = all(value == "ok" for value in checks.values())
        except Exception:  # a check that cannot run is a "no"
            logger.exception("readiness check failed")
            ready = False
        state = health_pb2.HealthCheckResponse.SERVING if ready else (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )  # fmt: skip
        for name in ("", SERVICE.full_name):
            self.health.set(name, state)
        return ready

    def stop(self, grace_s: float = 10.0) -> None:
        """Refuse new calls, give those under way `grace_s` to end."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()


def door_settings(settings: Settings) -> Settings:
    """The settings of the gRPC door's process: its waits bounded by GRPC_MAX_WAITS
    and GRPC_MAX_WAITS_PER_TENANT (MAX_WAITS and its share size an API process)."""
    return settings.with_overrides(
        max_waits=settings.grpc_max_waits, max_waits_per_tenant=settings.grpc_max_waits_per_tenant
    )


def start(container: Container, host: str | None = None, port: int | None = None) -> Running:
    """Serve on `host:port` (GRPC_HOST, GRPC_PORT by default; port 0: any free one)."""
    settings = container.settings
    size = settings.grpc_max_message_bytes
    server = grpc.server(
        ThreadPoolExecutor(max_workers=settings.grpc_threads, thread_name_prefix="grpc"),
        options=[
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", size),
            # A second server on a port in use fails to start, instead of sharing it.
            ("grpc.so_reuseport", 0),
            # A peer that vanished (its host gone, nothing sent) is noticed within about
            # 40 s, not gRPC's default 2 hours: its stream's waits and thread come back.
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )
    servicer = Servicer(container)
    container.parts.reconciler.follow()
    server.add_generic_rpc_handlers([Door(SERVICE, pb, servicer.rpcs(), servicer.authenticate)])
    checker = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    address = f"{host or settings.grpc_host}:{settings.grpc_port if port is None else port}"
    bound = server.add_insecure_port(address)
    if not bound:
        raise OSError(f"the gRPC door cannot listen on {address}")
    server.start()
    running = Running(server, bound, checker, container)
    running.check_health()
    return running


def serve(container: Container, stop: threading.Event) -> None:
    """Serve until `stop` is set, checking health every HEALTH_CHECK_S."""
    running = start(container)
    logger.info("gRPC door on %s:%d", container.settings.grpc_host, running.port)
    while not stop.wait(HEALTH_CHECK_S):
        running.check_health()
    logger.info("gRPC door stopping")
    running.stop()
