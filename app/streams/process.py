"""The stream consumer process: `python manage.py streams run` (or `python -m app.streams`).

It builds its services from `Container.from_env()`, as the workers do, runs the
publisher on a thread and the consumer loop on the main thread, and stops
cleanly on SIGTERM or SIGINT: the batch under way is recorded and acknowledged,
the publisher finishes what it holds. `make run` starts one (`manage.py up`);
more processes (or machines) share the work through the consumer group.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

from app.container import Container
from app.observability import logs, metrics, tracing
from app.streams import unstaged
from app.streams.consumer import Consumer
from app.streams.publisher import Publisher

logger = logging.getLogger("app.streams")

READY = "stream consumer {name} ready"


def consumer_name() -> str:
    """Unique per process, so two processes never share a consumer's pending
    entries: the host's name and the pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


def run(container: Container, *, checkpoint: Callable[[str], None] | None = None) -> None:
    """Consume until SIGTERM or SIGINT. `checkpoint` is where a test stages a
    crash (the fault suite's entry point); the service passes none."""
    settings = container.settings
    logs.setup(settings.log_level, settings.log_format)
    tracing.setup("inference-streams")
    if settings.streams_metrics_port:
        metrics.serve(settings.worker_metrics_host, settings.streams_metrics_port,
                      settings.metrics_token)  # fmt: skip
    engine = container.parts.logs
    container.parts.reconciler.follow()
    stage = checkpoint or unstaged
    publisher = Publisher(
        container.bindings, container.scope, engine, container.guards,
        settings.streams_dedupe_seconds, checkpoint=stage,
    )  # fmt: skip
    name = consumer_name()
    consumer = Consumer(
        container.bindings, container.scope, engine, settings, container.guards, name,
        on_accepted=publisher.accepted, checkpoint=stage,
    )  # fmt: skip
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    thread = threading.Thread(target=publisher.run, args=(stop,), name="stream-results")
    thread.start()
    logger.info(READY.format(name=name))
    try:
        consumer.run(stop)
    finally:
        stop.set()
        thread.join(30)
        container.close()
        logger.info("stream consumer %s stopped", name)


def main() -> None:
    run(Container.from_env())
