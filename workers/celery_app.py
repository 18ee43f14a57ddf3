"""The Celery app, configured from `Settings`, every task run inside a Flask app context.

Broker settings chosen on purpose:
- JSON only: messages carry job ids, never pickled objects or payloads.
- `task_acks_late` + `task_reject_on_worker_lost`: a message is acknowledged
  after the task returns, so a worker that dies mid-job leaves it on the queue.
- prefetch 1: a worker holds one job it is not running, not a batch it could lose.
- a visibility timeout (BROKER_VISIBILITY_TIMEOUT_SECONDS, an hour) far above
  any job's run time, so Redis rarely hands a running job to a second worker;
  when it does, the job's lease makes that second delivery a no-op.
- `worker_cancel_long_running_tasks_on_connection_loss`: a task whose message
  will be redelivered after a broker reconnect is stopped rather than run twice.
- Redis itself must run with `noeviction` and AOF (docker-compose.yml, and the
  embedded server), so queued messages survive memory pressure and restarts.
- no result backend: job state lives in PostgreSQL, never in Celery results.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from billiard.process import current_process
from celery import Celery, Task
from celery.signals import (
    celeryd_init,
    setup_logging,
    worker_process_init,
    worker_process_shutdown,
)
from flask import Flask

from app.jobs.dispatch import PURGE_TASK, SWEEP_TASK
from app.jobs.periodic import periodic
from app.observability import logs, metrics_dir
from app.platform.settings import Settings
from app.runtime import pipeline
from app.runtime.sessions import device_for
from app.schedules.service import TICK_TASK
from app.webhooks.delivery import SWEEP_TASK as WEBHOOK_SWEEP_TASK

logger = logging.getLogger(__name__)


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Periodic work, declared as data. Beat only sends these, on the control queue
    (never behind inference jobs), one pending message of each at most; the control
    worker runs them (see app.jobs.periodic)."""
    return {
        "sweep-jobs": periodic(SWEEP_TASK, settings.sweep_interval_seconds, settings),
        "purge-old-job-data": periodic(PURGE_TASK, 3600.0, settings),
        "send-due-webhooks": periodic(WEBHOOK_SWEEP_TASK, 1.0, settings),
        "fire-schedules": periodic(TICK_TASK, settings.schedule_tick_seconds, settings),
    }


def celery_init_app(app: Flask, settings: Settings) -> Celery:
    if settings.broker_visibility_timeout_seconds <= settings.job_time_limit_seconds:
        logger.warning(
            "BROKER_VISIBILITY_TIMEOUT_SECONDS (%g) should exceed JOB_TIME_LIMIT_SECONDS (%g): "
            "Redis will hand jobs still running to other workers, whose claims the lease "
            "then refuses",
            settings.broker_visibility_timeout_seconds,
            settings.job_time_limit_seconds,
        )

    class FlaskTask(Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            # A fresh log context per task: what it binds (model, job) ends with it.
            with app.app_context(), logs.scope():
                return self.run(*args, **kwargs)

    celery = Celery(app.name, task_cls=FlaskTask)
    celery.conf.update(
        broker_url=settings.broker_url,
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.jobs_queue,
        broker_transport_options={"visibility_timeout": settings.broker_visibility_timeout_seconds},
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        task_send_sent_event=False,
        beat_schedule=beat_schedule(settings),
        beat_scheduler="workers.beat:OnePendingScheduler",
        inference_redis_url=settings.redis_url,
        include=["workers.tasks"],
        timezone="UTC",
    )
    celery.set_default()
    app.extensions["celery"] = celery

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
        directory = metrics_dir.current()
        if directory is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), str(directory))

    @worker_process_init.connect(weak=False)
    def _after_fork(**_: Any) -> None:
        # Fresh database connections and ONNX Runtime sessions in each worker child.
        app.extensions["database"].after_fork()
        with app.app_context():
            from app.jobs.runtime import current_runtime

            runtime = current_runtime()
            runtime.sessions.device_id = device_for(
                getattr(current_process(), "index", 0) or 0, settings.cuda_devices
            )
            # A hard time limit: ORT holds the thread in C code, so the child is
            # killed; Celery starts a new one and the job's lease brings it back.
            runtime.on_time_limit = lambda _jobs: os.kill(os.getpid(), signal.SIGKILL)
            # Only the models whose queue this worker serves (-Q): a CPU worker never
            # holds a GPU model's session, a GPU worker no CPU model's.
            served = celery.amqp.queues.consume_from
            for card in runtime.repository.all():
                if not served or (card.queue or settings.model_queue) in served:
                    runtime.sessions.get(card)
                    pipeline.load(card)

    return celery
