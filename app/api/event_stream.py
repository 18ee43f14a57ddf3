"""Server-Sent Events for one job, read from `job_events`.

Each event carries its database id, so a client that reconnects with
`Last-Event-ID` (to this process or another) misses and repeats nothing. The
terminal event carries the whole job, as GET /jobs/<id> returns it, and ends
the stream. Between events the stream sleeps on the process's event bus;
a comment line every 15 s keeps proxies from closing it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

from app.db.models import TERMINAL_STATUSES, Job
from app.db.session import Database
from app.jobs.events import EventBus, events_after
from app.jobs.representation import JobSchema

KEEPALIVE_S = 15.0
MAX_STREAM_S = 600.0  # then the client reconnects with Last-Event-ID


def job_event_stream(
    database: Database, bus: EventBus, job_id: uuid.UUID, after: int
) -> Iterator[str]:
    ends_at = time.monotonic() + MAX_STREAM_S
    while True:
        seen = bus.version(job_id)
        with database.sessionmaker() as session:
            events = events_after(session, job_id, after)
            job = (
                session.get(Job, job_id)
                if any(e.status in TERMINAL_STATUSES for e in events)
                else None
            )
            for event in events:
                data = {
                    "job_id": str(job_id),
                    "status": event.status,
                    "attempt": event.attempt,
                    "at": event.at.isoformat(),
                }
                if event.status in TERMINAL_STATUSES and job is not None:
                    data["job"] = JobSchema().dump(job)
                yield f"id: {event.id}\nevent: job.{event.status}\ndata: {json.dumps(data)}\n\n"
                after = event.id
                if event.status in TERMINAL_STATUSES:
                    return
        remaining = ends_at - time.monotonic()
        if remaining <= 0:
            return
        if bus.wait(job_id, seen, min(KEEPALIVE_S, remaining)) == seen:
            yield ": keepalive\n\n"
