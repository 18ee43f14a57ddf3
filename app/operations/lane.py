"""The workers' side of the sync lane (app.sync.lane), and recovering calls whose
worker died.

In each worker child, one thread per model the child serves takes that model's
calls from its lane in micro-batches, runs them through the one inference
function (`app.runtime.engine.infer`, as every job's), answers them and
journals their records in one Redis step, then leaves the records to the
process's writer (app.sync.records): no PostgreSQL on the answering path. A
housekeeping thread keeps the child's liveness key and recovers the calls of
dead workers (`Recovery`, which an API process waiting on a call runs too).
"""

from __future__ import annotations

import contextlib
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

import redis

from app.cards import ModelCard
from app.errors import UnknownModel
from app.jobs import staging
from app.jobs.guards import ALL_ON, Guards
from app.repository.registry import ModelRepository
from app.runtime import engine
from app.runtime.sessions import SessionPool
from app.runtime.tensors import unpack
from app.sync import lane, records, replies
from app.sync.lane import Entry, Lane
from app.sync.records import RecordWriter
from app.sync.replies import Reply

logger = logging.getLogger(__name__)

MOST_CALLS = 64  # a micro-batch takes at most this many calls (and the card's max_batch_size)
TAKE_WAIT_S = 1  # seconds


def lane_models(repository: ModelRepository) -> list[ModelCard]:
    """The models whose sync calls travel the lane: worker-run, not generative."""
    return [
        card for card in repository.all()
        if card.generation is None and card.extra.get("execution") != "inline"
    ]  # fmt: skip


def idempotent(card: ModelCard | None) -> bool:
    """Whether a call may run again after its worker died: the card's `idempotent`
    (a model is a pure function of its inputs unless its card says otherwise)."""
    return card is not None and bool(card.extra.get("idempotent", True))


class Recovery:
    """Finds workers whose liveness key lapsed and settles the calls they had
    taken: once more at the front of the lane where the model is idempotent and
    it was the first attempt, else answered `lost`."""

    def __init__(self, lane_: Lane, repository: ModelRepository) -> None:
        self._lane, self._repository = lane_, repository

    def run(self) -> int:
        """Settle dead workers' calls; how many."""
        settled = 0
        dead = self._lane.dead_workers()
        models = {card.name for card in lane_models(self._repository)} if dead else set()
        for worker in dead:
            seized = self._lane.seize(worker, models)
            lost: list[tuple[str, Reply]] = []
            for raw in seized:
                entry = lane.decode(raw)
                if entry.attempt < 2 and idempotent(self._card(entry)):
                    self._lane.put_back(entry)
                else:
                    lost.append((entry.reply_to, _lost(entry)))
            if lost:
                replies.publish(self._lane.client, lost)
            if seized:
                logger.warning("worker %s died with %d sync call(s) taken: %d put back, %d lost",
                               worker, len(seized), len(seized) - len(lost), len(lost))  # fmt: skip
            settled += len(seized)
        return settled

    def _card(self, entry: Entry) -> ModelCard | None:
        try:
            return self._repository.resolve_rescanning(entry.model, entry.version)
        except UnknownModel:
            return None


def _lost(entry: Entry) -> Reply:
    return Reply(entry.id, lane.LOST, "worker_lost",
                 "the worker running this call stopped before answering it", None)  # fmt: skip


class LaneServer:
    """A worker child's lane threads (one per model) and its housekeeping thread."""

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
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, models: Iterable[ModelCard]) -> None:
        """Serve these models' lanes (after the fork: threads do not survive one)."""
        housekeeping = self._lanes()
        housekeeping.register(self.worker, self.lease_s)
        self._writer.start()
        self._spawn(self._keep, "lane-keeper", housekeeping)
        for card in models:
            self._spawn(self._serve, f"lane-{card.name}", card)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Finish the micro-batches under way, take no more, and say so (nothing
        of this worker's is left to recover)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(redis.RedisError):
            self._lanes().client.delete(lane.alive_key(self.worker))

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _keep(self, lane_: Lane) -> None:
        recovery = Recovery(lane_, self._repository)
        while not self._stopping.wait(self.lease_s / 3):
            try:
                lane_.register(self.worker, self.lease_s)
                recovery.run()
            except Exception as exc:  # Redis away: the lane threads wait for it too
                logger.warning("sync lane housekeeping failed: %s", exc)

    def _serve(self, card: ModelCard) -> None:
        lane_ = self._lanes()
        most = max(1, min(MOST_CALLS, card.batching.max_batch_size))
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                taken = lane_.take(self.worker, card.name, most, TAKE_WAIT_S)
            except Exception as exc:  # Redis away: nothing was taken
                logger.warning("sync lane of %s: %s; again in %.1f s", card.name, exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            if not taken:
                continue
            try:
                self.run(lane_, card.name, taken)
            except Exception as exc:  # never left unanswered while this worker lives
                logger.exception("sync lane of %s failed %d call(s)", card.name, len(taken))
                self._fail(lane_, card.name, taken, exc)

    def _fail(self, lane_: Lane, model: str, taken: list[bytes], exc: Exception) -> None:
        """Answer calls whose run raised (a fault of this code, not of their inputs)
        with the error, recorded like any failed call; if even that fails they
        stay taken, and are settled once this worker is gone."""
        started_at, detail = datetime.now(UTC), f"{type(exc).__name__}: {exc}"
        calls, made = [], []
        try:
            for entry in map(lane.decode, taken):
                _, reply, record = self._failed(entry, None, "inference_error", detail, started_at)
                calls.append((entry.reply_to, replies.encode(reply), records.encode(record)))
                made.append(record)
            journaled, heard = lane_.answer(self.worker, model, calls, self._guards.journal)
            if heard:
                self._writer.write_later(journaled, [made[i] for i in heard])
        except Exception as again:
            logger.warning("could not answer %d failed call(s) of %s: %s", len(taken), model,
                           again)  # fmt: skip

    def run(self, lane_: Lane, model: str, taken: list[bytes]) -> None:
        """Run taken calls, answer them and journal their records; the records are
        written behind. A call whose caller stopped waiting is dropped unrun."""
        now = time.time()
        entries = [e for e in map(lane.decode, taken) if e.deadline > now]
        by_version: dict[str, list[Entry]] = defaultdict(list)
        for entry in entries:
            by_version[entry.version].append(entry)
        calls: list[tuple[str, bytes, bytes]] = []
        made: list[records.Record] = []
        for version, group in by_version.items():
            for entry, reply, record in self._run_group(model, version, group):
                calls.append((entry.reply_to, replies.encode(reply), records.encode(record)))
                made.append(record)
        # (Only the fault suite turns the journal off: each record then lives in
        # this process's memory alone until it is written.)
        journaled, heard = lane_.answer(self.worker, model, calls, self._guards.journal)
        if heard:
            self._writer.write_later(journaled, [made[i] for i in heard])

    def _run_group(
        self, model: str, version: str, entries: list[Entry]
    ) -> list[tuple[Entry, Reply, records.Record]]:
        started_at, clock = datetime.now(UTC), time.perf_counter()
        try:
            card = self._repository.resolve_rescanning(model, version)
        except UnknownModel as exc:  # unloaded since the call was sent
            return [
                self._failed(e, None, "model_unavailable", str(exc), started_at) for e in entries
            ]
        try:
            arrays = [{s.name: a[s.name] for s in card.inputs} for a in map(_inputs, entries)]
            results = engine.infer(self._sessions, card, arrays)
        except Exception as exc:  # its file is missing or corrupt
            detail = f"model {card.ref} cannot serve: {type(exc).__name__}: {exc}"
            return [self._failed(e, card, "model_invalid", detail, started_at) for e in entries]
        share = (time.perf_counter() - clock) / max(1, len(entries))
        done = []
        for entry, request, result in zip(entries, arrays, results, strict=True):
            if isinstance(result, Exception):
                code = "non_finite_output" if isinstance(result, engine.NonFiniteOutput) else (
                    "inference_error")  # fmt: skip
                done.append(self._failed(entry, card, code, f"{type(result).__name__}: {result}",
                                         started_at, request))  # fmt: skip
                continue
            record = _record(entry, card, request, started_at, share, outputs=result)
            reply = Reply(entry.id, "succeeded", None, None, record["output_data"])
            done.append((entry, reply, record))
        return done

    def _failed(
        self, entry: Entry, card: ModelCard | None, code: str, detail: str,
        started_at: datetime, request: dict[str, Any] | None = None,
    ) -> tuple[Entry, Reply, records.Record]:  # fmt: skip
        record = _record(entry, card, request or {}, started_at, 0.0, error=(code, detail))
        return entry, Reply(entry.id, "failed", code, detail, None), record


def _inputs(entry: Entry) -> dict[str, Any]:
    return dict(unpack(entry.inputs))


def _record(
    entry: Entry,
    card: ModelCard | None,
    arrays: dict[str, Any],
    started_at: datetime,
    compute_s: float,
    *,
    outputs: dict[str, Any] | None = None,
    error: tuple[str, str] | None = None,
) -> records.Record:
    """The call's record: a finished job of the entry's id, from when it was sent."""
    rows = staging.batch_rows(card, arrays) if card is not None and arrays else 1
    values = staging.call_record(
        (entry.model, entry.version), rows, entry.tenant_id, started_at, compute_s,
        outputs=outputs, error=error,
    )  # fmt: skip
    values["id"] = entry.id
    values["created_at"] = datetime.fromtimestamp(entry.sent_at, UTC)
    values["attempts"] = values["max_attempts"] = entry.attempt
    return values
