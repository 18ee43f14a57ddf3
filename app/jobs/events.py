"""Job events: read from the `job_events` table, woken by PostgreSQL NOTIFY.

Each API process holds one LISTEN connection in a background thread; clients
that wait on a job (long-poll, event stream) block on a condition and query
the database once when their job changes, not once per tick. The database
stays the truth: a reconnect to another process resumes from `job_events`.
"""

from __future__ import annotations

import logging
import select
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy import Engine
from sqlalchemy import select as sql_select
from sqlalchemy.orm import Session

from app.background import LazyThread
from app.db.models import JobEvent

logger = logging.getLogger(__name__)

CHANNEL = "job_events"


class EventBus:
    """Counts NOTIFYs per job id; `wait` returns once the count moves past `seen`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._changes: dict[str, int] = defaultdict(int)
        self._condition = threading.Condition()
        self._listener = LazyThread(self._listen_forever, "job-events")
        self._listening = threading.Event()

    def version(self, job_id: uuid.UUID) -> int:
        self._ensure_listening()
        with self._condition:
            return self._changes[str(job_id)]

    def wait(self, job_id: uuid.UUID, seen: int, timeout: float) -> int:
        """Block until the job changed after version `seen`, or `timeout` passed."""
        key = str(job_id)
        with self._condition:
            self._condition.wait_for(lambda: self._changes[key] != seen, timeout)
            return self._changes[key]

    def _ensure_listening(self) -> None:
        self._listener.ensure()
        # A change before LISTEN would be missed; a waiter would then only see it
        # when its wait times out. Let the first caller wait for the listener.
        self._listening.wait(5)

    def _listen_forever(self) -> None:
        backoff = 1.0
        while True:
            try:
                self._listen()
            except Exception as exc:  # a lost connection: listen again; waiters time out meanwhile
                logger.warning("job event listener lost its connection (%s); reconnecting", exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _listen(self) -> None:
        raw = self._engine.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()  # this connection is ours for good, not the pool's
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")
        self._listening.set()
        try:
            while True:
                if select.select([conn], [], [], 30) == ([], [], []):
                    continue
                conn.poll()
                if conn.notifies:
                    with self._condition:
                        for note in conn.notifies:
                            self._changes[note.payload] += 1
                        conn.notifies.clear()
                        self._condition.notify_all()
        finally:
            conn.close()


def events_after(session: Session, job_id: uuid.UUID, after_id: int) -> list[JobEvent]:
    events = list(
        session.scalars(
            sql_select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
            .order_by(JobEvent.id)
        )
    )
    session.commit()
    return events
