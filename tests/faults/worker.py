"""The fault suite's Celery entry point: `celery -A tests.faults.worker worker` (also beat).

The service's own (workers.worker) over a container whose guards named in
FAULTS_GUARDS_OFF are off (a comma list of app.jobs.guards.Guards' fields:
claim, finish, lease, cap, republish, retry), so that a scenario can show what
its guard prevents. With FAULTS_CLOCK_SKEW_SECONDS, the service's code in it reads
a wall clock that many seconds off (tests.faults.clock); with FAULTS_DECODE_CRASH_FILE,
a child SIGKILLs itself at the point of the decode loop that file names
(tests.faults.decode_crash); with FAULTS_LANE_CRASH_FILE, at the point of the sync
lane (tests.faults.lane_crash). Only the fault suite's harness starts it.
"""

from __future__ import annotations

from app.container import Container
from app.platform.embedded import resolve_urls
from app.platform.settings import Settings
from tests.faults import lane_crash
from tests.faults.clock import skew_from_env
from tests.faults.decode_crash import install_from_env
from tests.faults.guards import guards_from_env
from workers.celery_app import worker_app

container = Container(resolve_urls(Settings.from_env()), guards=guards_from_env())
celery_app = worker_app(container)
skew_from_env()
install_from_env()
lane_crash.install_from_env()
