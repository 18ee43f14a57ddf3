"""Flask application factory: the HTTP door over one container, wiring only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask

from app.observability import logs
from app.platform.settings import Settings

if TYPE_CHECKING:
    from app.container import Container


def create_app(settings: Settings | None = None, container: Container | None = None) -> Flask:
    """The API over `container` (else one built from `settings`, else from the
    environment)."""
    from app.container import Container
    from app.platform.embedded import resolve_urls
    from app.web import register_api, request_logs
    from app.web.json_codec import OrjsonProvider
    from app.web.problems import register_error_handlers

    if container is None:
        container = Container(resolve_urls(settings or Settings.from_env()))
    settings = container.settings
    logs.setup(settings.log_level, settings.log_format)
    app = Flask(__name__)
    app.json = OrjsonProvider(app)
    request_logs.install(app, settings.log_format)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.extensions["container"] = container
    app.teardown_appcontext(lambda _exc: container.database.end_scope())
    register_error_handlers(app)
    # Made now, not by the first requests at once.
    for name in ("dataplane", "api_keys", "queue_metrics", "status"):
        getattr(container, name)
    register_api(app)
    return app
