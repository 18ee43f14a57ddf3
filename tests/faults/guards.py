"""The guards a fault-suite process runs without: FAULTS_GUARDS_OFF, a comma list of
app.jobs.guards.Guards' fields. Read by the suite's worker and consumer entry points."""

from __future__ import annotations

import os

from app.jobs.guards import Guards


def guards_from_env() -> Guards:
    names = [name.strip() for name in os.environ.get("FAULTS_GUARDS_OFF", "").split(",")]
    return Guards.off(*(name for name in names if name))
