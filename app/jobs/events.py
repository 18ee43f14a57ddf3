"""Job events: read from the `job_events` table, woken by PostgreSQL NOTIFY.

Each API process holds one LISTEN connection in a background thread; clients
that wait on a job (long-poll, event stream) block on a condition and query
the database once when their job changes, not once per tick. The database
stays the truth: a reconnect to another process resumes from `job_events`.

The LISTEN connection is checked: a `SELECT 1` after each HEALTH_CHECK_S of
silence, with TCP keepalives and a send timeout so a dead peer shows as an
error rather than a silent socket. A lost connection is opened again (with
backoff), and every waiter is then woken once to re-read its job: NOTIFYs sent
while nobody listened are gone, the rows are not.
"""

from __future__ import annotations

import logging
import select
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy import select as sql_select
from sqlalchemy.orm import Session

from app.jobs.outputs import CHANNEL as OUTPUT_CHANNEL
from app.jobs.tables import JobEvent
from app.platform.background import LazyThread
from app.platform.database import TCP_CHECKS

logger = logging.getLogger(__name__)

CHANNEL = "job_events"
LISTEN = f"LISTEN {CHANNEL}; LISTEN {OUTPUT_CHANNEL}"  # changes of state; output pieces
APPLICATION_NAME = "job-events-listener"
HEALTH_CHECK_S = 10.0


class EventBus:
    """Counts NOTIFYs per watched job id; a waiter sleeps until its job's count moves.

    Only jobs somebody waits on are counted, so a process that sees millions of
    jobs go by keeps no trace of them. A NOTIFY names the jobs a statement
    changed, comma-separated (the statement triggers send up to 200 ids each).
    """

    def __init__(self, engine: Engine, application_name: str = APPLICATION_NAME) -> None:
        """`application_name`: what its LISTEN connection is called in
        pg_stat_activity (a test names its own bus's apart)."""
        self._engine, self._application_name = engine, application_name
        self._changes: dict[str, int] = {}
        self._outputs: dict[str, int] = {}  # pieces of a generation's output (job_outputs)
        self._watchers: dict[str, int] = {}
        self._condition = threading.Condition()
        self._listener = LazyThread(self._listen_forever, "job-events")
        self._listening = threading.Event()
        self._backoff = 0.5

    @contextmanager
    def watching(self, job_id: uuid.UUID) -> Iterator[Watch]:
        """Count the job's changes while the block runs; read its state inside the
        block, after `version()`, so a change in between is not missed."""
        self._ensure_listening()
        key = str(job_id)
        with self._condition:
            self._watchers[key] = self._watchers.get(key, 0) + 1
            self._changes.setdefault(key, 0)
            self._outputs.setdefault(key, 0)
        try:
            yield Watch(self, key)
        finally:
            with self._condition:
                self._watchers[key] -= 1
                if not self._watchers[key]:
                    del self._watchers[key], self._changes[key], self._outputs[key]

    def _version(self, key: str, outputs: bool) -> int:
        with self._condition:
            return self._changes[key] + (self._outputs[key] if outputs else 0)

    def _wait(self, key: str, seen: int, timeout: float, outputs: bool) -> int:
        with self._condition:
            self._condition.wait_for(lambda: self._version(key, outputs) != seen, timeout)
            return self._version(key, outputs)

    def _changed(self, payloads: list[str], outputs: bool = False) -> None:
        counts = self._outputs if outputs else self._changes
        with self._condition:
            woken = False
            for payload in payloads:
                for key in payload.split(","):
                    if key in counts:
                        counts[key] += 1
                        woken = True
            if woken:
                self._condition.notify_all()

    def _wake_all(self) -> None:
        """Every waiter re-reads its job: changes may have gone by unheard."""
        with self._condition:
            for key in self._changes:
                self._changes[key] += 1
            if self._changes:
                self._condition.notify_all()

    def _ensure_listening(self) -> None:
        self._listener.ensure()
        # A change before LISTEN would be missed; a waiter would then only see it
        # when its wait times out. Let the first caller wait for the listener.
        self._listening.wait(5)

    def _listen_forever(self) -> None:
        while True:
            try:
                self._listen()
            except Exception as exc:  # a lost connection: listen again; waiters re-read
                logger.warning("job event listener lost its connection (%s); reconnecting", exc)
                time.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, 30.0)

    def _connect(self) -> Any:
        dialect = self._engine.dialect
        cargs, cparams = dialect.create_connect_args(self._engine.url)
        # libpq ignores the TCP checks on a Unix socket, as for the pool's connections
        params = {**cparams, **TCP_CHECKS, "application_name": self._application_name}
        conn = dialect.loaded_dbapi.connect(*cargs, **params)
        conn.autocommit = True
        return conn

    def _listen(self) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(LISTEN)
            if self._listening.is_set():  # a reconnect, after LISTEN: changes are heard again
                self._wake_all()
            self._listening.set()
            self._backoff = 0.5
            while True:
                if select.select([conn], [], [], HEALTH_CHECK_S) == ([], [], []):
                    with conn.cursor() as cursor:  # silence: is the server still there?
                        cursor.execute("SELECT 1")
                conn.poll()
                if conn.notifies:
                    for outputs in (False, True):
                        heard = [n.payload for n in conn.notifies
                                 if (n.channel == OUTPUT_CHANNEL) == outputs]  # fmt: skip
                        self._changed(heard, outputs)
                    conn.notifies.clear()
        finally:
            conn.close()


@dataclass(frozen=True)
class Watch:
    """One waiter's view of one job's changes."""

    bus: EventBus
    key: str

    def version(self, outputs: bool = False) -> int:
        """Its changes of state seen so far (with `outputs`, also the pieces of a
        generation's output recorded: an event stream sends those, a long-poll
        waits for a change of state)."""
        return self.bus._version(self.key, outputs)

    def wait(self, seen: int, timeout: float, outputs: bool = False) -> int:
        """Block until the job changed after version `seen`, or `timeout` passed."""
        return self.bus._wait(self.key, seen, timeout, outputs)


def events_after(session: Session, job_id: uuid.UUID, after_id: int) -> list[JobEvent]:
    events = list(
        session.scalars(
            sql_select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
            .order_by(JobEvent.id)
        )
    )
    return events
