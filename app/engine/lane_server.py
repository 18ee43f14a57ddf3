"""The workers' side of the sync lane (app.sync.lane).

In each worker child, one consumer thread per queue the child serves (however
many models the queue holds, added or removed while it runs) takes calls from
the queue's lane in micro-batches, runs each model version's calls the one way a
model runs (`app.execution.runs`, as every job's), answers them and journals
their records in one Redis step, then leaves the records to the process's writer
(app.sync.records): no PostgreSQL on the answering path. A housekeeping thread
keeps the child's liveness and its queues' serving keys, and recovers the calls
of dead workers (app.sync.recovery, which an API process waiting on a call runs
too). A child holds as many threads and Redis connections with 4 models as with 40.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from app.cards import ModelCard
from app.execution import runs
from app.execution.traces import traced_run
from app.jobs import staging
from app.jobs.guards import ALL_ON, Guards
from app.repository.registry import ModelRepository
from app.runtime.sessions import SessionPool
from app.runtime.tensors import unpack
from app.statuses import JobStatus
from app.sync import lane, records, replies
from app.sync.lane import Entry, Lane
from app.sync.records import RecordWriter
from app.sync.recovery import Recovery
from app.sync.replies import Reply

logger = logging.getLogger(__name__)

TAKE_WAIT_S = 1  # seconds a consumer blocks on an empty lane (so it notices a stop)

Answered = tuple[Entry, Reply, records.Record]


class LaneServer:
    """A worker child's lane consumers (one per queue) and its housekeeping thread."""

    def __init__(
        self,
        lanes: Callable[[], Lane],
        repository: ModelRepository,
        sessions: SessionPool,
        writer: RecordWriter,
        lease_s: float,
        guards: Guards = ALL_ON,
    ) -> None:
        """`lanes`: a new client of the lane (each thread blocks on its own)."""
        self._lanes, self._repository, self._sessions = lanes, repository, sessions
        self._writer, self.lease_s, self._guards = writer, lease_s, guards
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.queues: tuple[str, ...] = ()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._keeper: Lane | None = None

    def start(self, queues: Iterable[str], *, take: bool = True) -> None:
        """Serve these queues (after the fork: threads do not survive one): say so
        every third of a lease, which callers of their models look at, and take
        sync calls from their lanes unless `take` is False (SYNC_LANE off: calls
        come as jobs, but a worker that cannot come is still known)."""
        self.queues = tuple(dict.fromkeys(queues))
        self._keeper = self._lanes()
        self._keeper.register(self.worker, self.queues, self.lease_s)
        self._writer.start()
        self._spawn(self._keep, "lane-keeper", self._keeper)
        for queue in self.queues if take else ():
            self._spawn(self._serve, f"lane-{queue}", queue)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Finish the micro-batches under way, take no more, and say so (what is
        left taken is recovered by the others at once)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._keeper is not None:
            try:
                self._keeper.forget(self.worker)
            except Exception as exc:  # Redis away: its lease lapses instead
                logger.warning("could not say this worker's lanes stopped: %s", exc)

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _keep(self, lane_: Lane) -> None:
        recovery = Recovery(lane_)
        while not self._stopping.wait(self.lease_s / 3):
            try:
                lane_.register(self.worker, self.queues, self.lease_s)
                recovery.run()
            except Exception as exc:  # Redis away: the consumers wait for it too
                logger.warning("sync lane housekeeping failed: %s", exc)

    def _serve(self, queue: str) -> None:
        lane_ = self._lanes()
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                taken = lane_.take(self.worker, queue, lane.MOST_CALLS, TAKE_WAIT_S)
            except Exception as exc:  # Redis away: nothing was taken
                logger.warning("sync lane of queue %s: %s; again in %.1f s", queue, exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            if not taken:
                continue
            try:
                self.run(lane_, queue, taken)
            except Exception as exc:  # never left unanswered while this worker lives
                logger.exception("sync lane of queue %s failed %d call(s)", queue, len(taken))
                self._fail(lane_, queue, taken, exc)

    def _fail(self, lane_: Lane, queue: str, taken: list[bytes], exc: Exception) -> None:
        """Answer calls whose run raised (a fault of this code, not of their inputs)
        with the error, recorded like any failed call; if even that fails they
        stay taken, and are settled once this worker is gone."""
        started_at = datetime.now(UTC)
        failure = runs.Failed(runs.INFERENCE_ERROR, exc)
        try:
            done = [_answered(e, None, {}, started_at, failure) for e in map(lane.decode, taken)]
            self._answer(lane_, queue, done)
        except Exception as again:
            logger.warning("could not answer %d failed call(s) of queue %s: %s", len(taken),
                           queue, again)  # fmt: skip

    def run(self, lane_: Lane, queue: str, taken: list[bytes]) -> None:
        """Run taken calls, answer them and journal their records; the records are
        written behind. A call whose caller stopped waiting is dropped unrun."""
        now = time.time()
        groups: dict[tuple[str, str], list[Entry]] = defaultdict(list)
        for entry in map(lane.decode, taken):
            if entry.deadline > now:
                groups[(entry.model, entry.version)].append(entry)
        done: list[Answered] = []
        for (model, version), entries in groups.items():
            done += self._run_group(model, version, entries)
        self._answer(lane_, queue, done)

    def _answer(self, lane_: Lane, queue: str, done: list[Answered]) -> None:
        calls = [(e.reply_to, replies.encode(reply), records.encode(r)) for e, reply, r in done]
        # (Only the fault suite turns the journal off: each record then lives in
        # this process's memory alone until it is written.)
        journaled, heard = lane_.answer(self.worker, queue, calls, self._guards.journal)
        if heard:
            self._writer.write_later(journaled, [done[i][2] for i in heard])

    def _run_group(self, model: str, version: str, entries: list[Entry]) -> list[Answered]:
        started_at = datetime.now(UTC)
        card = runs.resolve(self._repository, model, version)
        if isinstance(card, runs.Failed):  # unloaded or removed since the call was sent
            return [_answered(e, None, {}, started_at, card) for e in entries]
        try:
            items = [{s.name: a[s.name] for s in card.inputs} for a in map(_inputs, entries)]
        except (KeyError, ValueError) as exc:  # the card changed since the call was checked
            failure = runs.Failed("invalid_input", exc)
            return [_answered(e, card, {}, started_at, failure) for e in entries]
        with traced_run(card, [(e.traceparent, e.sent_at) for e in entries]):
            outcomes = runs.run_card(self._sessions, card, items, self._repository)
        return [
            _answered(entry, card, item, started_at, outcome)
            for entry, item, outcome in zip(entries, items, outcomes, strict=True)
        ]


def _inputs(entry: Entry) -> dict[str, Any]:
    return dict(unpack(entry.inputs))


def _answered(
    entry: Entry,
    card: ModelCard | None,
    arrays: dict[str, Any],
    started_at: datetime,
    outcome: runs.Outcome,
) -> Answered:
    """The call's answer and its record: a finished job of the entry's id, from
    when it was sent."""
    outputs, error, compute_s = runs.result(outcome)
    rows = staging.batch_rows(card, arrays) if card is not None and arrays else 1
    record = staging.call_record(
        (entry.model, entry.version), rows, entry.tenant_id, started_at, compute_s,
        outputs=outputs, error=error,
    )  # fmt: skip
    record["id"] = entry.id
    record["traceparent"] = entry.traceparent
    record["created_at"] = datetime.fromtimestamp(entry.sent_at, UTC)
    record["attempts"] = record["max_attempts"] = entry.attempt
    if error is None:
        reply = Reply(entry.id, JobStatus.SUCCEEDED, None, None, record["output_data"])
    else:
        reply = Reply(entry.id, JobStatus.FAILED, error[0], error[1], None)
    return entry, reply, record
