"""Sync calls' answers sent straight from the worker to the waiting process, over Redis.

A sync call's job names its process's reply channel (`jobs.reply_to`). The worker
that finishes the job commits its record first, as for every job, then publishes
the outcome (status, error, packed outputs) on that channel. The waiting process
answers from it without reading PostgreSQL: no read-back of the row, and no wake-up
for the job's claim.

Pub/sub may drop a message (the subscriber reconnecting, Redis away), and a job
can end without a worker (expired, cancelled while queued). So a call not answered
within CHECK_S is read from PostgreSQL, and again every CHECK_S: the database
stays the truth, a lost message costs at most that much delay.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import redis

from app.platform.background import LazyThread

logger = logging.getLogger(__name__)

CHECK_S = 1.0  # a call not answered over Redis is read from PostgreSQL this often
HEALTH_CHECK_S = 10.0  # the subscriber's connection is pinged after this much silence
# Replies that came before their call was followed (the job finished between its
# commit and `add`): kept this long, at most this many.
EARLY_S = 30.0
EARLY_MAX = 4096
CHANNEL_PREFIX = "inference:replies:"


@dataclass(frozen=True, slots=True)
class Reply:
    """A finished job as its caller's answer needs it (app.sync.calls.Outcome)."""

    id: uuid.UUID
    status: str
    error_code: str | None
    error_message: str | None
    output_data: bytes | None
    outputs: None = None


def encode(reply: Reply) -> bytes:
    """A JSON head line, then the packed outputs as they are (no base64)."""
    head = {
        "id": str(reply.id),
        "status": reply.status,
        "error_code": reply.error_code,
        "error_message": reply.error_message,
        "outputs": reply.output_data is not None,
    }
    return orjson.dumps(head) + b"\n" + (reply.output_data or b"")


def decode(payload: bytes) -> Reply:
    head, _, body = payload.partition(b"\n")
    fields = orjson.loads(head)
    return Reply(
        uuid.UUID(fields["id"]), fields["status"], fields["error_code"], fields["error_message"],
        body if fields["outputs"] else None,
    )  # fmt: skip


def publish(client: redis.Redis, replies: list[tuple[str, Reply]]) -> None:
    """Send each reply on its channel: one round trip for all of them."""
    pipe = client.pipeline(transaction=False)
    for channel, reply in replies:
        pipe.publish(channel, encode(reply))
    pipe.execute()


class Replies:
    """One per process: its reply channel, a thread subscribed to it, and the
    followers (`follow`) its replies are handed to, by job id."""

    def __init__(self, client: Callable[[], redis.Redis]) -> None:
        self._client = client
        self.channel = CHANNEL_PREFIX + uuid.uuid4().hex
        self._lock = threading.Lock()
        self._followers: dict[uuid.UUID, Follower] = {}
        self._early: OrderedDict[uuid.UUID, tuple[float, Reply]] = OrderedDict()
        self._listener = LazyThread(self._listen_forever, "replies")
        self._subscribed = threading.Event()
        self._backoff = 0.5

    def follow(self) -> Follower:
        """A follower for many jobs (one caller's calls)."""
        self.listening()
        return Follower(self)

    def listening(self) -> bool:
        """Whether this process's channel is subscribed, waiting a moment for it
        the first time: a reply before SUBSCRIBE would be lost (a job's call would
        be read after CHECK_S; a lane call's would go unanswered)."""
        self._listener.ensure()
        return self._subscribed.wait(5)

    def _add(self, follower: Follower, job_id: uuid.UUID) -> Reply | None:
        with self._lock:
            self._followers[job_id] = follower
            early = self._early.pop(job_id, None)
        return early[1] if early else None

    def _remove(self, job_ids: list[uuid.UUID]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._followers.pop(job_id, None)

    def _deliver(self, reply: Reply) -> None:
        with self._lock:
            follower = self._followers.pop(reply.id, None)
            if follower is None:
                now = time.monotonic()
                self._early[reply.id] = (now, reply)
                while self._early and (
                    len(self._early) > EARLY_MAX
                    or next(iter(self._early.values()))[0] < now - EARLY_S
                ):
                    self._early.popitem(last=False)
                return
        follower._heard(reply)

    def _oldest_early(self) -> float:
        return next(iter(self._early.values()))[0]

    def _check_all(self) -> None:
        """After a reconnect: replies may have gone by unheard; every follower reads."""
        with self._lock:
            followers = set(self._followers.values())
        for follower in followers:
            follower._check_now()

    def _listen_forever(self) -> None:
        while True:
            try:
                self._listen()
            except Exception as exc:  # a lost connection: subscribe again; followers read
                logger.warning("reply listener lost its connection (%s); reconnecting", exc)
                time.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, 30.0)

    def _listen(self) -> None:
        pubsub = self._client().pubsub()
        try:
            pubsub.subscribe(self.channel)
            while True:
                message = pubsub.get_message(timeout=HEALTH_CHECK_S)
                if message is None:
                    pubsub.ping()  # silence: is the server still there?
                elif message["type"] == "subscribe":
                    if self._subscribed.is_set():
                        self._check_all()
                    self._subscribed.set()
                    self._backoff = 0.5
                elif message["type"] == "message":
                    try:
                        reply = decode(message["data"])
                    except (ValueError, KeyError) as exc:
                        logger.warning("a malformed reply was dropped: %s", exc)
                        continue
                    self._deliver(reply)
        finally:
            pubsub.close()


class Follower:
    """The jobs one caller waits on: `wait` hands over the replies heard and the
    jobs due to be read from PostgreSQL (none heard of for CHECK_S)."""

    def __init__(self, hub: Replies) -> None:
        self._hub = hub
        self._lock = threading.Lock()
        self._checks: dict[uuid.UUID, float] = {}  # job -> when to read it next
        self._heard_replies: dict[uuid.UUID, Reply] = {}
        self._event = threading.Event()
        self._closed = False

    def add(self, job_id: uuid.UUID) -> None:
        """Follow a job too; nothing once closed (its caller is gone)."""
        with self._lock:
            if self._closed:
                return
            self._checks[job_id] = time.monotonic() + CHECK_S
        early = self._hub._add(self, job_id)
        if early is not None:
            self._heard(early)

    def discard(self, job_ids: list[uuid.UUID]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._checks.pop(job_id, None)
                self._heard_replies.pop(job_id, None)
        self._hub._remove(job_ids)

    def wait(self, timeout: float) -> tuple[dict[uuid.UUID, Reply], set[uuid.UUID]]:
        """The replies heard, and the jobs due for a read, waiting up to `timeout`
        (less when a read is due sooner) for the first."""
        with self._lock:
            first = min(self._checks.values(), default=time.monotonic() + timeout)
        self._event.wait(max(0.0, min(timeout, first - time.monotonic())))
        now = time.monotonic()
        with self._lock:
            self._event.clear()
            heard, self._heard_replies = self._heard_replies, {}
            due = {job_id for job_id, at in self._checks.items() if at <= now} - heard.keys()
            for job_id in due:
                self._checks[job_id] = now + CHECK_S
        return heard, due

    def poke(self) -> None:
        """End the current `wait` now (with what was heard so far)."""
        self._event.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            jobs, self._checks = list(self._checks), {}
        self._hub._remove(jobs)

    def _heard(self, reply: Reply) -> None:
        with self._lock:
            if reply.id not in self._checks:
                return
            self._heard_replies[reply.id] = reply
        self._event.set()

    def _check_now(self) -> None:
        with self._lock:
            for job_id in self._checks:
                self._checks[job_id] = 0.0
        self._event.set()
