"""The statuses of a job and of a batch, declared once.

Each is a column's vocabulary (the tables' CHECK constraints are built from these
enums), the API's (the schemas list their values) and the raw SQL's: one declaration
per fact, so a status is named the same everywhere and a new one is added in one
place. The members are `str`s: they compare equal to the words the database holds
and serialize as them, so the JSON, the rows and the SQL read as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class BatchStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PARTIALLY_SUCCEEDED = "partially_succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A job still to run or running; one that has ended (and never moves again).
OPEN = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})
TERMINAL = frozenset(JobStatus) - OPEN
BATCH_OPEN = frozenset({BatchStatus.QUEUED, BatchStatus.RUNNING})
BATCH_TERMINAL = frozenset(BatchStatus) - BATCH_OPEN


def ordered(statuses: Iterable[StrEnum]) -> tuple[str, ...]:
    """The statuses' words in their enum's order (a set has none of its own)."""
    chosen = set(statuses)
    if not chosen:
        return ()
    kind = type(next(iter(chosen)))
    return tuple(s.value for s in kind if s in chosen)


def sql_list(statuses: Iterable[StrEnum]) -> str:
    """The statuses quoted for raw SQL's `IN (...)`, in their enum's order: `'a', 'b'`."""
    return ", ".join("'" + word.replace("'", "''") + "'" for word in ordered(statuses))


OPEN_SQL = sql_list(OPEN)
TERMINAL_SQL = sql_list(TERMINAL)
BATCH_OPEN_SQL = sql_list(BATCH_OPEN)
BATCH_TERMINAL_SQL = sql_list(BATCH_TERMINAL)
