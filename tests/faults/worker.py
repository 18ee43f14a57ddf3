"""The fault suite's Celery entry point: `celery -A tests.faults.worker worker` (also beat).

The service's own (workers.worker) over a container whose guards named in
FAULTS_GUARDS_OFF are off (a comma list of app.jobs.guards.Guards' fields:
claim, finish, lease, cap, republish, retry), so that a scenario can show what
its guard prevents. Only the fault suite's harness starts it.
"""

from __future__ import annotations

import os

from app.container import Container
from app.jobs.guards import Guards
from app.platform.embedded import resolve_urls
from app.platform.settings import Settings
from workers.celery_app import worker_app


def guards_from_env() -> Guards:
    names = [name.strip() for name in os.environ.get("FAULTS_GUARDS_OFF", "").split(",")]
    return Guards.off(*(name for name in names if name))


container = Container(resolve_urls(Settings.from_env()), guards=guards_from_env())
celery_app = worker_app(container)
