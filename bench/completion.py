"""Knowing when every job is done without asking the contender's API.

Polling `GET /jobs/<id>` for thousands of jobs would load the very service being
measured. Instead the bench reads the contender's own job table every 0.5 s with
one aggregate query (how many are terminal, the last `finished_at`, the longest
wait in the queue). The timing figures come from the rows' timestamps, not from
when the poll noticed, so the poll interval does not blur them.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bench.infra import Database

logger = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass(frozen=True)
class Progress:
    terminal: int  # jobs in a final state, over the whole table
    failed: int
    pending: int  # jobs not yet final
    first_created: float | None  # epoch seconds of the first job created since `since`
    last_finished: float | None  # epoch seconds of the latest finish
    max_queued_s: float | None  # largest started - created, jobs created since `since`


class JobStore(Protocol):
    def progress(self, since: float) -> Progress: ...

    def terminal_among(self, ids: list[str]) -> int: ...

    def close(self) -> None: ...


class PostgresJobs:
    """A `jobs` table with id, status, created_at, started_at, finished_at: the
    service's and the textbook design's."""

    TERMINAL = ("succeeded", "failed", "cancelled", "expired")

    def __init__(self, database: Database) -> None:
        self.conn = database.connect()

    def progress(self, since: float) -> Progress:
        with self.conn.cursor() as cur:
            cur.execute(
                """
                SELECT count(*) FILTER (WHERE status = ANY(%(t)s)),
                       count(*) FILTER (WHERE status = 'failed'),
                       count(*) FILTER (WHERE status <> ALL(%(t)s)),
                       extract(epoch FROM min(created_at)
                               FILTER (WHERE created_at >= to_timestamp(%(since)s))),
                       extract(epoch FROM max(finished_at)),
                       extract(epoch FROM max(started_at - created_at)
                               FILTER (WHERE created_at >= to_timestamp(%(since)s)))
                FROM jobs
                """,
                {"t": list(self.TERMINAL), "since": since},
            )
            row = cur.fetchone()
        assert row is not None
        return Progress(
            terminal=int(row[0]),
            failed=int(row[1]),
            pending=int(row[2]),
            first_created=float(row[3]) if row[3] is not None else None,
            last_finished=float(row[4]) if row[4] is not None else None,
            max_queued_s=float(row[5]) if row[5] is not None else None,
        )

    def terminal_among(self, ids: list[str]) -> int:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[]) AND status = ANY(%s)",
                (ids, list(self.TERMINAL)),
            )
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def timings(self, ids: list[str]) -> list[tuple[float, float, float]]:
        """(created_at in epoch seconds, queued seconds, created-to-finished seconds)
        of each finished job."""
        with self.conn.cursor() as cur:
            cur.execute(
                """
                SELECT extract(epoch FROM created_at),
                       extract(epoch FROM started_at - created_at),
                       extract(epoch FROM finished_at - created_at)
                FROM jobs WHERE id = ANY(%s::uuid[]) AND finished_at IS NOT NULL
                """,
                (ids,),
            )
            return [(float(c), float(q), float(t)) for c, q, t in cur.fetchall()]

    def statuses(self, since: float) -> dict[str, int]:
        """How many jobs created since `since` (epoch seconds) are in each status."""
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT status, count(*) FROM jobs WHERE created_at >= to_timestamp(%s) "
                "GROUP BY status",
                (since,),
            )
            return {str(status): int(n) for status, n in cur.fetchall()}

    def close(self) -> None:
        self.conn.close()


class BentoResults:
    """BentoML's task result store: a SQLite table `result` (task_id, status,
    created_at, completed_at) that its workers write. `created_at` has one-second
    resolution there, so time in the queue is not measurable and is left out."""

    TERMINAL = ("completed", "failed", "canceled")

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        # Rows up to this rowid are final and counted in `_settled`, so each poll
        # reads only newer rows: a scan of the whole table (inputs and results
        # are stored in it) held SQLite's lock long enough to slow BentoML down.
        self._settled_rowid = 0
        self._settled = (0, 0, None)  # terminal, failed, latest completed_at

    def progress(self, since: float) -> Progress:
        rows = self.conn.execute(
            "SELECT rowid, status, completed_at FROM result WHERE rowid > ? ORDER BY rowid",
            (self._settled_rowid,),
        ).fetchall()
        terminal, failed, latest = self._settled
        pending, prefix = 0, True
        for rowid, status, completed_at in rows:
            final = status in self.TERMINAL
            terminal += final
            failed += status == "failed"
            pending += not final
            if completed_at and (latest is None or completed_at > latest):
                latest = completed_at
            if prefix and final:
                self._settled_rowid = rowid
                self._settled = (terminal, failed, latest)
            prefix = prefix and final
        last = datetime.fromisoformat(latest).timestamp() if latest else None
        return Progress(terminal, failed, pending, None, last, None)

    def terminal_among(self, ids: list[str]) -> int:
        done = 0
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            row = self.conn.execute(
                f"SELECT count(*) FROM result WHERE task_id IN ({','.join('?' * len(chunk))}) "
                f"AND status IN ({','.join('?' * len(self.TERMINAL))})",
                (*chunk, *self.TERMINAL),
            ).fetchone()
            done += int(row[0])
        return done

    def close(self) -> None:
        self.conn.close()


def wait_until_done(
    store: JobStore, expected_terminal: int, since: float, timeout: float
) -> tuple[Progress, bool]:
    """Poll until at least `expected_terminal` jobs are final and none is pending.
    Returns the last progress and whether it got there before `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        progress = store.progress(since)
        if progress.terminal >= expected_terminal and progress.pending == 0:
            return progress, True
        if time.monotonic() > deadline:
            logger.warning(
                "not done after %.0fs: %d final of %d expected, %d pending",
                timeout,
                progress.terminal,
                expected_terminal,
                progress.pending,
            )
            return progress, False
        time.sleep(POLL_S)
