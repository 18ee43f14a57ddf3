"""The consumer loop: input entries to jobs, acknowledged only once recorded.

One consumer group (STREAMS_GROUP) per input log; each process is one consumer
of it, named after its host and pid, so two processes share the entries and
none gets one another holds. Each round:

- reads the bindings again every STREAMS_REFRESH_SECONDS (new ones get their
  group, paused and deleted ones are no longer read);
- claims entries idle longer than STREAMS_CLAIM_IDLE_SECONDS (their consumer
  died before acknowledging them: XAUTOCLAIM);
- reads new entries of every ready binding in one call (up to STREAMS_READ_COUNT
  per log), and turns each log's batch into jobs with one binding operation;
- acknowledges a batch only after that operation committed. Entries that cannot
  become a job (not JSON, unknown model, inputs that do not fit) are appended to
  the dead-letter log with the reason, then acknowledged with the rest: a poison
  entry never holds up those behind it.

Backpressure is lag, not refusal: when a model's queue or the tenant's quota is
full, the batch is left unacknowledged and its binding is not read until the
refusal's `retry_after`; it then reads the entries it holds again (its own
pending ones) before new ones, fewer at a time while they keep being refused (a
quota smaller than a batch still lets some through). The entries nobody read
meanwhile are the group's lag, in /metrics and on the status page.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import redis

from app.errors import DomainError, QueueFull, QuotaExceeded, Unavailable
from app.observability import metrics
from app.operations import EntryRequest
from app.operations.bindings import ActiveBinding, BindingOperations, EntryOutcome
from app.operations.execution import Guards
from app.platform.database import database_unavailable
from app.platform.logstreams import LogEngine, LogEntry, LogGone
from app.platform.settings import Settings
from app.streams import codec, unstaged

logger = logging.getLogger(__name__)

BLOCK_S = 1.0  # the longest a read waits for entries (and SIGTERM for an answer)
FAILED_RETRY_S = 1.0  # after a batch failed for another reason (database, Redis)
FAILURES_TO_DEAD_LETTER = 3  # an entry failing alone this often is a dead letter
PURGE_EVERY_S = 3600.0
DEAD_KEY = "inference:stream-dead:{binding}:{entry}"


@dataclass
class _State:
    """A binding as this consumer follows it."""

    spec: ActiveBinding
    chunk: int  # entries per read: halved while refused, doubled back after
    resume_at: float = 0.0  # not read before this (monotonic): a refusal's retry_after
    own_first: bool = True  # read the entries it holds before new ones


class Consumer:
    def __init__(
        self,
        operations: BindingOperations,
        scope: Callable[[], AbstractContextManager[object]],
        logs: LogEngine,
        settings: Settings,
        guards: Guards,
        name: str,
        *,
        on_accepted: Callable[[Iterable[uuid.UUID]], None] = lambda ids: None,
        checkpoint: Callable[[str], None] = unstaged,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.operations, self.scope, self.logs = operations, scope, logs
        self.settings, self.guards, self.name = settings, guards, name
        self.group, self.count = settings.streams_group, settings.streams_read_count
        self.on_accepted, self.checkpoint, self.clock = on_accepted, checkpoint, clock
        self.bindings: dict[uuid.UUID, _State] = {}
        self._failures: dict[tuple[uuid.UUID, str], int] = {}  # an entry's failures alone
        self._refresh_at = self._claim_at = 0.0
        self._purge_at = clock() + 60.0

    def run(self, stop: threading.Event) -> None:
        """Rounds until `stop` is set; the round under way finishes (its batch is
        recorded and acknowledged), so SIGTERM loses nothing and repeats nothing."""
        while not stop.is_set():
            try:
                self.round()
            except LogGone as exc:  # a log was deleted, its group with it: make them again
                logger.warning("%s; making the consumer groups again", exc)
                self.bindings.clear()
                self._refresh_at = 0.0
            except Exception:  # the database or Redis went away: their entries stay pending
                logger.exception("stream consumer round failed; trying again")
                stop.wait(FAILED_RETRY_S)
                self._refresh_at = 0.0

    def round(self) -> None:
        now = self.clock()
        if now >= self._refresh_at:
            self.refresh()
            self._refresh_at = now + self.settings.streams_refresh_seconds
        if now >= self._claim_at:
            self.claim()
            self._claim_at = now + max(0.5, self.settings.streams_claim_idle_seconds / 2)
        if now >= self._purge_at:
            with self.scope():
                self.operations.purge_entries()
            self._purge_at = now + PURGE_EVERY_S
        ready = [s for s in self.bindings.values() if s.resume_at <= now]
        for state in [s for s in ready if s.own_first or s.chunk < self.count]:
            read = self.logs.read_pending if state.own_first else self._read_new_of
            entries = read(self.group, self.name, state.spec.input, state.chunk)
            if entries:
                self.take(state, entries)
            else:
                state.own_first = False
        fresh = {s.spec.input: s for s in ready if not s.own_first and s.chunk >= self.count}
        if not fresh:
            self._idle(now)
            return
        got = self.logs.read_new(self.group, self.name, list(fresh), self.count, BLOCK_S)
        for log, entries in got.items():
            if entries and log in fresh:
                self.take(fresh[log], entries)

    def _read_new_of(self, group: str, consumer: str, log: str, count: int) -> list[LogEntry]:
        return self.logs.read_new(group, consumer, [log], count, 0).get(log, [])

    def _idle(self, now: float) -> None:
        """Nothing to read: wait for the first binding to resume, or a tick."""
        waits = [s.resume_at - now for s in self.bindings.values() if s.resume_at > now]
        time.sleep(max(0.01, min([BLOCK_S, *waits])))

    def refresh(self) -> None:
        """Follow the unpaused bindings: a new one gets its group (from the log's
        first entry); one gone or paused is no longer read."""
        with self.scope():
            active = {b.id: b for b in self.operations.active()}
        for binding_id, spec in active.items():
            state = self.bindings.get(binding_id)
            if state is None:
                self.logs.ensure_group(spec.input, self.group)
                self.bindings[binding_id] = _State(spec, self.count)
            else:
                state.spec = spec
        for binding_id in set(self.bindings) - set(active):
            del self.bindings[binding_id]

    def claim(self) -> None:
        """Take the entries a dead consumer held (idle for STREAMS_CLAIM_IDLE_SECONDS)."""
        idle_s, now = self.settings.streams_claim_idle_seconds, self.clock()
        for state in list(self.bindings.values()):
            if state.resume_at > now:
                continue  # refused for now: what it holds waits with it
            entries = self.logs.claim_idle(self.group, self.name, state.spec.input, idle_s,
                                           state.chunk)  # fmt: skip
            if entries:
                logger.info("claimed %d idle entries of %s", len(entries), state.spec.input)
                self.take(state, entries)

    def take(self, state: _State, entries: list[LogEntry]) -> None:
        """`handle`, kept to its own binding. A batch that fails for a reason of its
        own (not an outage of the database or Redis, which every batch waits out) is
        read again in halves, so the entry at fault ends up alone; failing alone
        FAILURES_TO_DEAD_LETTER times, it is dead-lettered. So no entry holds up its
        binding for good, and no binding the others."""
        try:
            self.handle(state, entries)
        except LogGone:
            raise
        except Exception as exc:
            state.own_first, state.resume_at = True, self.clock() + FAILED_RETRY_S
            if database_unavailable(exc) or isinstance(exc, redis.RedisError | OSError):
                logger.warning("%s: %s; reading it again", state.spec.input, exc)
                return
            logger.exception("%s: a batch of %d entries failed", state.spec.input, len(entries))
            if len(entries) > 1:
                state.chunk = max(1, len(entries) // 2)
                return
            [entry] = entries
            key = (state.spec.id, entry.id)
            self._failures[key] = self._failures.get(key, 0) + 1
            if self._failures[key] >= FAILURES_TO_DEAD_LETTER:
                del self._failures[key]
                error = Unavailable(
                    f"entry {entry.id} could not be accepted after {FAILURES_TO_DEAD_LETTER} "
                    f"tries ({type(exc).__name__}); the error was logged"
                )
                self._dead_letters(state.spec, [(entry, error)])
                self.logs.ack(state.spec.input, self.group, [entry.id])
                state.resume_at = 0.0

    def handle(self, state: _State, entries: list[LogEntry]) -> None:
        """One batch of one binding: recorded as jobs (or dead letters), then
        acknowledged; or left pending when its model or tenant has no room."""
        spec, ids = state.spec, [e.id for e in entries]
        decoded = [(entry, codec.decode(entry, self.settings.max_request_bytes))
                   for entry in entries]  # fmt: skip
        requests = [d for _, d in decoded if isinstance(d, EntryRequest)]
        if not self.guards.ack:  # guard off: acknowledged before anything is recorded
            self.logs.ack(spec.input, self.group, ids)
            self.checkpoint("accepted")
        try:
            outcomes = self._accept(spec, requests) if requests else []
        except (QueueFull, QuotaExceeded) as exc:
            self._defer(state, len(entries), exc)
            return
        state.chunk = min(self.count, state.chunk * 2)
        errors = {o.entry_id: o.error for o in outcomes if o.error is not None}
        errors |= {e.id: d for e, d in decoded if isinstance(d, DomainError)}
        if errors:
            self._dead_letters(spec, [(e, errors[e.id]) for e in entries if e.id in errors])
        made = [o.job_id for o in outcomes if o.job_id is not None and not o.redelivered]
        if made:
            self.on_accepted(made)
        self._count(spec, len(made), sum(o.redelivered for o in outcomes), len(errors))
        if self.guards.ack:
            self.checkpoint("accepted")  # recorded, not yet acknowledged
            self.logs.ack(spec.input, self.group, ids)

    def _accept(self, spec: ActiveBinding, requests: list[EntryRequest]) -> list[EntryOutcome]:
        with self.scope():
            return self.operations.accept_entries(
                spec, requests, find_redelivered=self.guards.redelivery
            )

    def _defer(self, state: _State, count: int, exc: DomainError) -> None:
        retry_s = float(exc.retry_after or 1)
        state.resume_at, state.own_first = self.clock() + retry_s, True
        state.chunk = max(1, min(state.chunk, count) // 2)
        metrics.STREAM_ENTRIES.labels(state.spec.tenant.name, "deferred").inc(count)
        logger.info("%s: %s; reading it again in %g s (%d at a time)", state.spec.input,
                    exc.detail, retry_s, state.chunk)  # fmt: skip

    def _dead_letters(
        self, spec: ActiveBinding, poisoned: list[tuple[LogEntry, DomainError]]
    ) -> None:
        """Each entry with its reason into the binding's dead-letter log, once (a
        redelivered poison entry is not dead-lettered twice)."""
        letters = [
            (DEAD_KEY.format(binding=spec.id, entry=entry.id),
             codec.dead_letter(entry, error, spec.input))
            for entry, error in poisoned
        ]  # fmt: skip
        self.logs.append_once(spec.dead_letter, letters, self.settings.streams_dedupe_seconds)
        logger.info("%s: %d entries to %s", spec.input, len(letters), spec.dead_letter)

    def _count(self, spec: ActiveBinding, made: int, again: int, dead: int) -> None:
        tenant = spec.tenant.name
        for outcome, count in (("accepted", made), ("redelivered", again),
                               ("dead_lettered", dead)):  # fmt: skip
            if count:
                metrics.STREAM_ENTRIES.labels(tenant, outcome).inc(count)
