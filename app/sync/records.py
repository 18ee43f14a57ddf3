"""Sync calls' records, written behind their answers and never lost.

A call answered without a job row first (the sync lane's, an inline model's)
still leaves its record: a finished job, so GET /jobs/<id>, /usage and the
statistics show it. The record goes first to a Redis stream, the journal, in
the same step that answers the call (the lane's answer script; for an inline
call, one XADD before its caller hears back); then the process's writer thread
inserts the journaled records in one statement per batch (ON CONFLICT DO
NOTHING: a record written twice is written once) and deletes them from the
journal. Records a process left there (it was killed between answering and
writing) are drained by any writer once older than JOURNAL_GRACE_S: the record
of an answered call survives the worker's and the API's restart. The journal
lives as long as Redis' own data (its persistence setting).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson
import redis
from sqlalchemy import Table
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.jobs.tables import Job
from app.platform.background import LazyThread
from app.platform.database import Database
from app.statuses import JobStatus

logger = logging.getLogger(__name__)

JOURNAL = "inference:lane:journal"
JOURNAL_GRACE_S = 5.0  # a journaled record older than this is any writer's to write
DRAIN_EVERY_S = 1.0
# Records handed over within this long of the first share a statement and a commit
# (they are written behind their answers: nobody waits for them).
GATHER_S = 0.05
_DRAIN_COUNT = 256  # journal entries a drain reads at a time
# Journal entries a read of a record not yet written looks through, newest first:
# in steady state the journal holds a few (records are written within GATHER_S).
_FIND_COUNT = 2048
_BATCH_COUNT = 2048  # handed-over entries one write takes at most
_DATES = ("created_at", "started_at", "finished_at")

_JOBS: Table = Job.__table__  # type: ignore[assignment]

Record = dict[str, Any]


@functools.cache
def _insert_statement(columns: tuple[str, ...]) -> str:
    """One INSERT of many records sent as one JSON array, typed by the table itself
    (json_populate_recordset): orjson encodes it in C, where a multi-row VALUES
    through SQLAlchemy cost 0.14 ms of Python a record, on a thread that shares
    the GIL with the request threads. A record already there is kept (a journal
    entry written twice)."""
    unknown = set(columns) - set(_JOBS.c.keys())
    if unknown:
        raise ValueError(f"not columns of jobs: {sorted(unknown)}")
    names = ", ".join(columns)
    return (
        f"INSERT INTO jobs ({names}) SELECT {names} "
        "FROM json_populate_recordset(NULL::jobs, %s) ON CONFLICT (id) DO NOTHING"
    )


def _as_json(records: list[Record]) -> str:
    """The records as a JSON array; output_data as bytea's hex text."""

    def row(record: Record) -> Record:
        data = record["output_data"]
        return {**record, "output_data": None if data is None else "\\x" + data.hex()}

    return orjson.dumps([row(record) for record in records]).decode()


def encode(record: Record) -> bytes:
    """A JSON head line (dates as ISO 8601), then the packed outputs as they are."""
    head = {k: v for k, v in record.items() if k != "output_data"}
    return orjson.dumps(head) + b"\n" + (record.get("output_data") or b"")


def decode(payload: bytes) -> Record:
    head, _, outputs = payload.partition(b"\n")
    record: Record = orjson.loads(head)
    record["id"] = uuid.UUID(record["id"])
    for name in _DATES:
        if record.get(name) is not None:
            record[name] = datetime.fromisoformat(record[name])
    record["output_data"] = outputs if record["status"] == JobStatus.SUCCEEDED else None
    return record


def journal(client: redis.Redis, records: list[Record]) -> bytes:
    """Journal records (one stream entry); its id."""
    fields = {str(index): encode(record) for index, record in enumerate(records)}
    entry: Any = client.xadd(JOURNAL, fields)  # type: ignore[arg-type]
    return bytes(entry)


class RecordWriter:
    """One per process: writes journaled records to PostgreSQL on a thread of its
    own (started on first use, after a fork), many in one statement, and drains
    what other processes left in the journal. `on_written` is told of each batch
    written (a worker's metrics)."""

    def __init__(
        self,
        database: Database,
        client: Callable[[], redis.Redis],
        on_written: Callable[[Session, list[Record]], None] | None = None,
        grace_s: float = JOURNAL_GRACE_S,
    ) -> None:
        self._database, self._client, self._on_written = database, client, on_written
        self.grace_s = grace_s
        self._queue: queue.SimpleQueue[tuple[bytes | None, list[Record]]] = queue.SimpleQueue()
        self._thread = LazyThread(self._run, "records")
        self._group = GroupJournal(lambda rs: journal(self._client(), rs), self.write_later)

    def journal(self, records: list[Record]) -> bytes:
        """Journal these records now (the call may be answered once this returns),
        and write them behind. Calls of this process journaling at once share one
        XADD (see GroupJournal)."""
        return self._group.journal(records)

    def write_later(self, entry: bytes | None, records: list[Record]) -> None:
        """Write records journaled as `entry` behind, then delete it (None: records
        not journaled, in the fault suite alone)."""
        self._thread.ensure()
        self._queue.put((entry, records))

    def start(self) -> None:
        """Start draining the journal now (a worker: before any call reaches it)."""
        self._thread.ensure()

    def _run(self) -> None:
        drain_at = 0.0
        while True:
            batch = self._gather()
            if batch:
                self._write(batch)
            if time.monotonic() >= drain_at:
                drain_at = time.monotonic() + DRAIN_EVERY_S
                self._drain_quietly()

    def _gather(self) -> list[tuple[bytes | None, list[Record]]]:
        """The first hand-over (waiting up to DRAIN_EVERY_S), then, GATHER_S later,
        all that queued meanwhile, taken in one go rather than one blocking get (and
        one wait for the GIL, among the request threads) a record."""
        try:
            batch = [self._queue.get(timeout=DRAIN_EVERY_S)]
        except queue.Empty:
            return []
        time.sleep(GATHER_S)
        try:
            while len(batch) < _BATCH_COUNT:
                batch.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return batch

    def _drain_quietly(self) -> None:
        try:
            self.drain()
        except Exception as exc:  # Redis or PostgreSQL away: the next round tries again
            logger.warning("could not drain the record journal: %s", exc)

    def _write(self, batch: list[tuple[bytes | None, list[Record]]]) -> None:
        try:
            entries = [entry for entry, _ in batch if entry is not None]
            self.write(entries, [r for _, rs in batch for r in rs])
        except Exception as exc:  # left in the journal: drained once older than the grace
            logger.warning("could not write %d call record(s) yet: %s", len(batch), exc)

    def write(self, entries: list[bytes], records: list[Record]) -> None:
        """Insert these records (those already there are kept), then delete their
        journal entries. A record the table refuses (its tenant deleted since) is
        dropped, logged, rather than left to block the journal."""
        if records:
            # In one order everywhere: two writers draining the same entries at once
            # (a dead process's, after the grace) lock the same rows in the same
            # order and cannot deadlock.
            records = sorted(records, key=lambda record: record["id"])
            try:
                self._insert(records)
            except IntegrityError:
                for record in records:
                    try:
                        self._insert([record])
                    except IntegrityError as exc:
                        logger.warning("dropped the record of call %s: %s", record["id"],
                                       exc.orig)  # fmt: skip
        if entries:
            self._client().xdel(JOURNAL, *entries)

    def _insert(self, records: list[Record]) -> None:
        statement = _insert_statement(tuple(records[0]))
        with self._database.separate_unit_of_work() as session:
            session.connection().exec_driver_sql(statement, (_as_json(records),))
            if self._on_written is not None:
                self._on_written(session, records)

    def write_now(self, job_id: uuid.UUID, tenant_id: int) -> bool:
        """Write the record of `job_id` now if it waits in the journal and is
        `tenant_id`'s (a read of an id its caller was just given must not be told
        404); whether it did. Its entry stays for its writer to delete (a record
        written twice is written once)."""
        found = find(self._client(), job_id)
        if found is None or found[1]["tenant_id"] != tenant_id:
            return False
        self.write([], [found[1]])
        return True

    def drain(self) -> int:
        """Write the journal's records older than the grace (their writer died or
        could not write them); how many entries were drained."""
        oldest = int((time.time() - self.grace_s) * 1000)
        found: Any = self._client().xrange(JOURNAL, "-", f"{oldest}-0", count=_DRAIN_COUNT)
        if not found:
            return 0
        records = [decode(payload) for _, fields in found for payload in fields.values()]
        self.write([entry for entry, _ in found], records)
        logger.info("wrote %d call record(s) left in the journal", len(records))
        return len(found)


def find(client: redis.Redis, job_id: uuid.UUID) -> tuple[bytes, Record] | None:
    """The journal entry holding the record of `job_id`, and the record, if it is
    journaled and not written yet (newest entries first, at most _FIND_COUNT)."""
    needle = b'"id":"' + str(job_id).encode() + b'"'
    found: Any = client.xrevrange(JOURNAL, "+", "-", count=_FIND_COUNT)
    for entry, fields in found:
        for payload in fields.values():
            head = payload.partition(b"\n")[0]
            if needle in head:
                return entry, decode(payload)
    return None


class _Hand:
    """One caller's records waiting in a GroupJournal."""

    __slots__ = ("done", "entry", "error", "lead", "records")

    def __init__(self, records: list[Record]) -> None:
        self.records, self.done = records, threading.Event()
        self.entry: bytes | None = None
        self.error: BaseException | None = None
        self.lead = False


class GroupJournal:
    """Group commit for the journal: the first caller journals what the callers
    waiting by then handed over, all in one XADD, and the next waiting caller
    leads the next round. Under 16 clients an inline call's own XADD was an
    eighth of the API's Python time; a caller still returns only once its own
    records are in Redis, and the group's records are written behind together
    (one entry, deleted once all of them are written)."""

    def __init__(
        self,
        append: Callable[[list[Record]], bytes],
        write_later: Callable[[bytes | None, list[Record]], None],
    ) -> None:
        self._append, self._write_later = append, write_later
        self._lock = threading.Lock()
        self._waiting: list[_Hand] = []
        self._leading = False

    def journal(self, records: list[Record]) -> bytes:
        mine = _Hand(records)
        with self._lock:
            self._waiting.append(mine)
            mine.lead = not self._leading
            self._leading = True
        if not mine.lead:
            mine.done.wait()
        if mine.lead:  # first, or handed the lead while waiting
            self._round()
        if mine.error is not None:
            raise mine.error
        assert mine.entry is not None
        return mine.entry

    def _round(self) -> None:
        with self._lock:
            hands, self._waiting = self._waiting, []
        records = [record for hand in hands for record in hand.records]
        entry, error = None, None
        try:
            entry = self._append(records)
            self._write_later(entry, records)
        except BaseException as exc:  # each caller of the group hears it
            error = exc
        for hand in hands:
            hand.entry, hand.error, hand.lead = entry, error, False
            hand.done.set()
        with self._lock:
            if self._waiting:
                self._waiting[0].lead = True
                self._waiting[0].done.set()
            else:
                self._leading = False
