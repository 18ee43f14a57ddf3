"""gunicorn's settings for the API (`gunicorn -c python:app.platform.gunicorn_conf`).

Metrics: every API process counts into PROMETHEUS_MULTIPROC_DIR (a temporary
directory when none is set), which the master clears at start and in which it
marks a worker that exits as dead (see app.observability.metrics_dir). This module runs in the
master before any application import, so that prometheus_client, imported later
in the workers, counts in multi-process mode.

Logs: with LOG_FORMAT=json gunicorn's own lines are JSON too, and its access
log gives way to the API's `request` lines (app.observability.logs).
"""

from __future__ import annotations

from typing import Any

from app.observability import logs, metrics_dir
from app.platform.settings import Settings

_settings = Settings.from_env()
_directory = metrics_dir.ensure("api")

logconfig_dict = logs.gunicorn_config(_settings.log_level, _settings.log_format) or {}


def on_starting(_server: Any) -> None:
    metrics_dir.clear(_directory)


def child_exit(_server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, str(_directory))
