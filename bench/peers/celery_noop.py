"""A bare Celery round trip: the same broker and settings as the service's jobs
(prefork 2, acks_late, prefetch 1, JSON, no result backend) and a task that does
nothing. The floor of one-message-per-job designs: the service must beat it by
not sending one message per job."""

from __future__ import annotations

import os

from celery import Celery

QUEUE = "bench-noop"

app = Celery("noop", broker=os.environ.get("BENCH_NOOP_BROKER_URL", "memory://"))
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.noop")
def noop() -> None:
    """Nothing: what is left is Celery's and Redis's cost per message."""
