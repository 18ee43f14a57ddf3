"""Flask application factory: the HTTP door over one container, wiring only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.observability import logs, tracing
from app.platform.settings import Settings

# The one place the version is written: pyproject.toml reads it (setuptools' `attr`),
# and the CLI's --version falls back to it where the package is not installed.
__version__ = "0.1.0"

if TYPE_CHECKING:  # Flask loads with the factory: no other process (a worker) loads it
    from flask import Flask

    from app.container import Container


def create_app(settings: Settings | None = None, container: Container | None = None) -> Flask:
    """The API over `container` (else one built from `settings`, else from the
    environment)."""
    from flask import Flask

    from app.container import Container
    from app.platform.embedded import resolve_urls
    from app.web import request_logs
    from app.web.api import register_api
    from app.web.context import IN_PROGRESS, in_progress_of
    from app.web.json_codec import OrjsonProvider
    from app.web.problems import register_error_handlers

    if container is None:
        container = Container(resolve_urls(settings or Settings.from_env()))
    settings = container.settings
    logs.setup(settings.log_level, settings.log_format)
    tracing.setup("inference-api")  # (where OTEL_EXPORTER_OTLP_ENDPOINT is set)
    app = Flask(__name__)
    app.json = OrjsonProvider(app)
    request_logs.install(app, settings.log_format)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.extensions["container"] = container
    app.extensions[IN_PROGRESS] = in_progress_of(settings)
    app.teardown_appcontext(lambda _exc: container.end_scope())
    register_error_handlers(app)
    # Made now, not by the first requests at once.
    for name in ("jobs", "calls", "tenants", "status"):
        getattr(container, name)
    container.parts.reconciler.follow()
    register_api(app)
    return app
