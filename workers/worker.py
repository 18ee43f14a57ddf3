"""Entry point: `celery -A workers.worker worker` (also beat and flower)."""

from app import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
