"""Server-Sent Events for one job, read from `job_events`.

Each event carries its database id, so a client that reconnects with
`Last-Event-ID` (to this process or another) misses and repeats nothing. The
terminal event carries the whole job, as GET /jobs/<id> returns it, and ends
the stream. A generation's text comes as `output` events between the state
events, as Replicate's streams send it: each one's data a piece of the text
(a line of it a `data:` line), so the pieces, joined, are the job's
`outputs.text`. Between events the stream sleeps on the process's event bus;
a comment line every 15 s keeps proxies from closing it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

from app.operations.jobs import (
    OUTPUT,
    Job,
    JobEvent,
    JobOperations,
    JobSchema,
)
from app.statuses import TERMINAL

KEEPALIVE_S = 15.0
MAX_STREAM_S = 600.0  # then the client reconnects with Last-Event-ID


def job_event_stream(
    jobs: JobOperations,
    job_id: uuid.UUID,
    after: int,
    release: Callable[[], None] = lambda: None,
) -> Iterator[str]:
    """`release` is called when the stream ends, however it ends (the client
    going away closes the generator)."""
    try:
        yield from _stream(jobs, job_id, after)
    finally:
        release()


def _stream(jobs: JobOperations, job_id: uuid.UUID, after: int) -> Iterator[str]:
    ends_at = time.monotonic() + MAX_STREAM_S
    with jobs.watching().watching(job_id) as watch:
        while True:
            seen = watch.version(outputs=True)
            # read in a session of its own, closed before a slow client reads
            for event_id, status, message in _messages(*jobs.events(job_id, after), job_id):
                yield message
                after = event_id
                if status in TERMINAL:
                    return
            remaining = ends_at - time.monotonic()
            if remaining <= 0:
                return
            if watch.wait(seen, min(KEEPALIVE_S, remaining), outputs=True) == seen:
                yield ": keepalive\n\n"


def _messages(
    events: list[JobEvent], job: Job | None, job_id: uuid.UUID
) -> list[tuple[int, str, str]]:
    """The job's events as SSE messages; the terminal one carries the job."""
    messages = []
    for event in events:
        if event.status == OUTPUT:
            lines = "".join(f"data: {line}\n" for line in (event.text or "").split("\n"))
            messages.append((event.id, event.status, f"id: {event.id}\nevent: output\n{lines}\n"))
            continue
        data: dict[str, object] = {
            "job_id": str(job_id),
            "status": event.status,
            "attempt": event.attempt,
            "at": event.at.isoformat(),
        }
        if event.status in TERMINAL and job is not None:
            data["job"] = JobSchema().dump(job)
        message = f"id: {event.id}\nevent: job.{event.status}\ndata: {json.dumps(data)}\n\n"
        messages.append((event.id, event.status, message))
    return messages
