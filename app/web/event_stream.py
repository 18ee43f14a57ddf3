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
from collections.abc import Callable, Iterator

from sqlalchemy.orm import Session

from app.jobs.events import EventBus, events_after
from app.jobs.representation import JobSchema
from app.jobs.tables import TERMINAL_STATUSES, Job
from app.platform.database import Database

KEEPALIVE_S = 15.0
MAX_STREAM_S = 600.0  # then the client reconnects with Last-Event-ID


def job_event_stream(
    database: Database,
    bus: EventBus,
    job_id: uuid.UUID,
    after: int,
    release: Callable[[], None] = lambda: None,
) -> Iterator[str]:
    """`release` is called when the stream ends, however it ends (the client
    going away closes the generator)."""
    try:
        yield from _stream(database, bus, job_id, after)
    finally:
        release()


def _stream(database: Database, bus: EventBus, job_id: uuid.UUID, after: int) -> Iterator[str]:
    ends_at = time.monotonic() + MAX_STREAM_S
    with bus.watching(job_id) as watch:
        while True:
            seen = watch.version()
            with database.sessionmaker() as session:  # closed before a slow client reads
                messages = _messages(session, job_id, after)
            for event_id, status, message in messages:
                yield message
                after = event_id
                if status in TERMINAL_STATUSES:
                    return
            remaining = ends_at - time.monotonic()
            if remaining <= 0:
                return
            if watch.wait(seen, min(KEEPALIVE_S, remaining)) == seen:
                yield ": keepalive\n\n"


def _messages(session: Session, job_id: uuid.UUID, after: int) -> list[tuple[int, str, str]]:
    """The job's events after `after` as SSE messages; the terminal one carries the job."""
    events = events_after(session, job_id, after)
    job = session.get(Job, job_id) if any(e.status in TERMINAL_STATUSES for e in events) else None
    messages = []
    for event in events:
        data: dict[str, object] = {
            "job_id": str(job_id),
            "status": event.status,
            "attempt": event.attempt,
            "at": event.at.isoformat(),
        }
        if event.status in TERMINAL_STATUSES and job is not None:
            data["job"] = JobSchema().dump(job)
        message = f"id: {event.id}\nevent: job.{event.status}\ndata: {json.dumps(data)}\n\n"
        messages.append((event.id, event.status, message))
    return messages
