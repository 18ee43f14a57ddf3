"""A control plane of a test's own: its queues, so its beats and workers see no
other test's messages."""

from __future__ import annotations

import uuid

import pytest

from app.platform.settings import Settings


@pytest.fixture
def plane(settings: Settings) -> Settings:
    queue = f"{settings.jobs_queue}-cp-{uuid.uuid4().hex[:4]}"
    return settings.with_overrides(
        jobs_queue=queue, control_queue=f"{queue}-control", webhooks_queue=f"{queue}-hooks"
    )


def plane_env(plane: Settings) -> dict[str, str]:
    return {
        "JOBS_QUEUE": plane.jobs_queue, "CONTROL_QUEUE": plane.control_queue,
        "WEBHOOKS_QUEUE": plane.webhooks_queue, "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        "SWEEP_INTERVAL_SECONDS": "1", "SCHEDULE_TICK_SECONDS": "1",
        "ORT_INTRA_OP_THREADS": "1", "DRAIN_LINGER_MS": "0",
    }  # fmt: skip
