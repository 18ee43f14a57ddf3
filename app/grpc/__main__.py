"""`python -m app.grpc`: the gRPC door, until SIGTERM or Ctrl-C.

Settings from the environment (GRPC_HOST, GRPC_PORT, ...), as every process.
With GRPC_METRICS_PORT its metrics are served there; the multi-process
directory is set before prometheus_client is imported (app.observability.metrics_dir).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from app.container import Container
from app.observability import logs, metrics_dir, tracing
from app.platform.embedded import resolve_urls
from app.platform.settings import Settings


def main() -> None:
    from app.grpc.server import door_settings

    container = Container(door_settings(resolve_urls(Settings.from_env())))
    settings = container.settings
    logs.setup(settings.log_level, settings.log_format)
    tracing.setup("inference-grpc")
    if settings.grpc_metrics_port:
        metrics_dir.clear(metrics_dir.ensure("grpc"))
        from app.observability import metrics

        metrics.serve(settings.worker_metrics_host, settings.grpc_metrics_port,
                      settings.metrics_token)  # fmt: skip
    from app.grpc.server import serve

    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve(container, stop)


if __name__ == "__main__":
    main()
