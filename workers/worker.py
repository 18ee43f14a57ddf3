"""Entry point: `celery -A workers.worker worker` (also beat and flower)."""

from app.observability import metrics_dir
from app.platform.settings import Settings

# Before the app (and prometheus_client) is imported: a worker that serves metrics
# counts its pool children's too (see app.observability.metrics_dir).
if Settings.from_env().worker_metrics_port:
    metrics_dir.ensure("worker")

from app.container import Container
from workers.celery_app import install_worker_hooks

container = Container.from_env()
celery_app = container.celery
install_worker_hooks(celery_app, container)
