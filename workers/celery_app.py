"""The worker's own hooks on the Celery app its container built (see
app.platform.broker): logging in LOG_FORMAT, metrics of the pool's children, and
after each fork fresh database connections and ONNX Runtime sessions."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from billiard.process import current_process
from celery import Celery
from celery.signals import (
    celeryd_init,
    setup_logging,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)

from app.container import Container
from app.observability import logs, metrics_dir, tracing
from app.runtime.sessions import device_for

logger = logging.getLogger(__name__)


def worker_app(container: Container) -> Celery:
    """What a Celery entry point (`celery -A ...`: worker, beat, Flower) exposes:
    `container`'s Celery app, with the worker's hooks installed.

    A worker that serves metrics counts its pool children's too: the multi-process
    directory is set here, before the tasks (and prometheus_client) are imported
    (see app.observability.metrics_dir)."""
    if container.settings.worker_metrics_port:
        metrics_dir.ensure("worker")
    celery = container.parts.celery
    install_worker_hooks(celery, container)
    return celery


def install_worker_hooks(celery: Celery, container: Container) -> None:
    settings = container.settings

    @setup_logging.connect(weak=False)
    def _setup_logging(loglevel: int | str | None = None, **_: Any) -> None:
        # Celery configures no logging when a receiver does it (hijack or not): the
        # same handler as the API's, in LOG_FORMAT, at the more verbose of --loglevel
        # and LOG_LEVEL.
        level = min(logs.level_number(settings.log_level), logs.level_number(loglevel or "INFO"))
        logs.setup(level, settings.log_format, force=True)

    @celeryd_init.connect(weak=False)
    def _worker_starting(instance: Any = None, **_: Any) -> None:
        # A worker's main process, before its pool starts.
        if settings.log_format == "json":
            # Before Celery's own checks warn (root privileges), which precede its
            # logging setup; and no banner on stdout among the JSON lines.
            logs.setup(settings.log_level, "json", force=True)
            if instance is not None:
                instance.quiet = True
        directory = metrics_dir.current()
        if directory is not None:
            metrics_dir.clear(directory, keep_pid=os.getpid())
        if settings.worker_metrics_port:
            from app.observability import metrics

            host, port = settings.worker_metrics_host, settings.worker_metrics_port
            metrics.serve(host, port, settings.metrics_token)
            logger.info("metrics of this worker's processes on http://%s:%d/metrics", host, port)

    @worker_process_shutdown.connect(weak=False)
    def _child_exit(**_: Any) -> None:
        if container.built("worker"):
            container.worker.stop_lanes()
        directory = metrics_dir.current()
        if directory is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), str(directory))

    @worker_shutting_down.connect(weak=False)
    def _hand_over(**_: Any) -> None:
        # The main process, on a warm shutdown: its children's decode loops hand
        # their generations to other workers rather than finish them first.
        try:
            container.worker.hand_over()
        except Exception:  # their leases still bring them back, only later
            logger.warning("could not ask this worker's decode loops to hand over", exc_info=True)

    @worker_process_init.connect(weak=False)
    def _after_fork(**_: Any) -> None:
        # Fresh database connections and ONNX Runtime sessions in each worker child.
        container.after_fork()
        tracing.setup("inference-worker")  # (its exporter's thread, made after the fork)
        container.parts.reconciler.follow()
        runner = container.parts.runner
        runner.sessions.device_id = device_for(
            getattr(current_process(), "index", 0) or 0, settings.cuda_devices
        )
        # A hard time limit: ORT holds the thread in C code, so the child is
        # killed; Celery starts a new one and the job's lease brings it back.
        runner.on_time_limit = lambda _jobs: os.kill(os.getpid(), signal.SIGKILL)
        # The queues this child serves (-Q), but the control worker's: their lanes,
        # whatever models they hold now or later (app.engine.lane_server).
        served = set(celery.amqp.queues.consume_from or settings.inference_queues)
        queues = sorted(served - {settings.control_queue, settings.webhooks_queue})
        if not queues:
            return
        # Warm: the sessions of the models on those queues now (a CPU worker never
        # holds a GPU model's session, a GPU worker no CPU model's). A generative
        # model's session is the decode loop's own, made when a loop first runs in
        # this child (app.engine.core), not a second copy here.
        mine = [
            card for card in runner.repository.all()
            if card.generation is None and (card.queue or settings.model_queue) in queues
        ]  # fmt: skip
        from app.runtime.engine import warm  # (with the metrics client: after worker_app)

        for card in mine[: settings.max_loaded_models or None]:  # within MAX_LOADED_MODELS
            warm(runner.sessions, card)
        container.worker.lane_server.start(queues, take=settings.sync_lane)
