"""What a webhook says: the job as GET /jobs/<id> shows it (a running
generation's `job.output`: with the text so far), or the batch as
GET /batches/<id> does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.batches.representation import BatchSchema, describe
from app.batches.tables import Batch
from app.jobs.outputs import text_so_far
from app.jobs.representation import JobSchema
from app.jobs.tables import Job
from app.statuses import JobStatus
from app.webhooks.tables import WebhookDelivery


def render(session: Session, delivery: WebhookDelivery, now: datetime, max_bytes: int) -> str:
    """The event as sent on every attempt: the job as GET /jobs/<id> shows it. Outputs
    that would make it larger than `max_bytes` (WEBHOOK_MAX_PAYLOAD_BYTES) are
    replaced by a link."""
    if delivery.batch_id is not None:  # a batch's event: the batch as GET /batches/<id> shows it
        batch = session.get(Batch, delivery.batch_id)
        assert batch is not None
        body = {"type": delivery.event_type, "timestamp": now.isoformat(),
                "data": BatchSchema().dump(describe(session, batch))}  # fmt: skip
        return json.dumps(body)
    job = session.get(Job, delivery.job_id)
    assert job is not None
    if job.status == JobStatus.RUNNING and job.output_data is None:  # (a `job.output` event)
        text = text_so_far(session, job.id)
        if text is not None:
            setattr(job, "so_far", {"text": text})  # noqa: B010  (not a column: never written)
    data: dict[str, Any] = JobSchema().dump(job)
    body = {"type": delivery.event_type, "timestamp": now.isoformat(), "data": data}
    encoded = json.dumps(body)
    if len(encoded) > max_bytes:
        data["outputs"] = None
        data["outputs_url"] = f"/jobs/{delivery.job_id}"
        encoded = json.dumps(body)
    return encoded
