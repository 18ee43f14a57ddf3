"""Every domain's tables on the one `metadata`: what Alembic compares the
migrations with (`migrations/env.py`, `tests/test_migrations.py`)."""

from __future__ import annotations

from app.batches import tables as batches
from app.bindings import tables as bindings
from app.jobs import tables as jobs
from app.platform import fencing
from app.platform.orm import Base
from app.repository import tables as repository
from app.schedules import tables as schedules
from app.tenancy import tables as tenancy
from app.webhooks import tables as webhooks

DOMAINS = (tenancy, jobs, batches, schedules, webhooks, repository, bindings, fencing)
metadata = Base.metadata
