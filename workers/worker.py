"""Entry point: `celery -A workers.worker worker` (also beat and flower)."""

from app.observability import metrics_dir
from app.platform.settings import Settings

# Before the app (and prometheus_client) is imported: a worker that serves metrics
# counts its pool children's too (see app.observability.metrics_dir).
if Settings.from_env().worker_metrics_port:
    metrics_dir.ensure("worker")

from app import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
