"""Entry point: `celery -A workers.worker worker` (also beat and flower)."""

from app.container import Container
from workers.celery_app import worker_app

container = Container.from_env()
celery_app = worker_app(container)
