"""Flask application factory: wires extensions and blueprints, nothing else."""

from __future__ import annotations

from flask import Flask

from app.observability import logs
from app.platform.settings import Settings


def create_app(settings: Settings | None = None) -> Flask:
    from app.jobs.admission import Admission
    from app.jobs.dispatch import Dispatcher
    from app.jobs.events import EventBus
    from app.jobs.inserts import JobInserter
    from app.jobs.quotas import Quotas
    from app.models.registry import ModelRepository
    from app.models.states import SharedStates
    from app.observability.metrics import QueueCollector
    from app.platform.database import Database, close_session
    from app.platform.embedded import resolve_urls
    from app.status.service import StatusBoard
    from app.status.workers import WorkerCensus
    from app.tenancy.keys import KeyCache
    from app.web import register_api
    from app.web.holds import Holds
    from app.web.problems import register_error_handlers
    from workers.celery_app import celery_init_app

    settings = resolve_urls(settings or Settings.from_env())
    logs.setup(settings.log_level, settings.log_format)
    app = Flask(__name__)
    logs.install(app, settings.log_format)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.extensions["settings"] = settings
    app.extensions["database"] = database = Database(settings.database_url, settings.db_pool_size)
    app.extensions["events"] = EventBus(database.engine)
    app.extensions["models"] = models = ModelRepository(
        settings.model_repository,
        SharedStates(database.engine),
        settings.model_state_cache_seconds,
    )
    app.extensions["api_keys"] = KeyCache(settings.api_key_cache_seconds)
    app.extensions["queue_metrics"] = QueueCollector(
        database.engine, lambda: {card.name for card in app.extensions["models"].all()}
    )
    app.teardown_appcontext(close_session)
    register_error_handlers(app)
    celery = celery_init_app(app, settings)
    # Each model's wake-ups go to the queue its card names (or DEFAULT_MODEL_QUEUE).
    app.extensions["dispatch"] = dispatcher = Dispatcher(
        celery, settings.redis_url, settings.jobs_queue,
        lambda model: models.queue_of(model) or settings.model_queue,
    )  # fmt: skip
    app.extensions["inserts"] = JobInserter(database.engine, dispatcher.wake)
    app.extensions["admission"] = Admission(settings.max_queued_per_model)
    app.extensions["quotas"] = Quotas(settings)
    app.extensions["holds"] = Holds(settings.max_waits_per_tenant, settings.max_waits)
    queues = (settings.jobs_queue, settings.webhooks_queue, settings.control_queue)
    census = WorkerCensus(celery, settings.redis_url, queues, settings.status_cache_seconds)
    app.extensions["status"] = StatusBoard(
        census, settings.retention_seconds, settings.status_cache_seconds
    )
    register_api(app)
    return app
