"""A generation's text as it is made, from the worker to whoever follows the job, over
Redis pub/sub (channel `inference:tokens:<job id>`).

A message is one JSON object: `{"index": n, "at": i, "text": "...", "tokens": k}`
(`at`: where the text begins in the job's output) for a
piece (a few tokens, coalesced: the worker flushes a job's text at most every
FLUSH_S or every FLUSH_TOKENS tokens, all due jobs in one pipeline per decode
step), and a last one, sent after the job's record is committed, with
`"final": true`, `"status"`, `"finish_reason"`, `"usage"` and the whole `"output"`
text. Joined, the pieces' texts are the job's `outputs.text`. Pub/sub keeps
nothing: a follower that missed a piece (it subscribed late, or reconnected)
sends the rest of the whole text from the last message, or from the record if
that was lost too (the job row is the truth: `follow`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import RedisError

from app.platform.database import database_unavailable

CHANNEL_PREFIX = "inference:tokens:"
FLUSH_S = 0.02
FLUSH_TOKENS = 8


def channel(job_id: uuid.UUID | str) -> str:
    return f"{CHANNEL_PREFIX}{job_id}"


@dataclass
class _Pending:
    text: str = ""
    tokens: int = 0
    index: int = 0
    at: int = 0  # where `text` begins in the job's output
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # its tokens', if asked
    since: float = field(default_factory=time.monotonic)


class PiecePublisher:
    """Coalesces each job's new text and publishes what is due in one round trip."""

    def __init__(self, redis: Callable[[], Any]) -> None:
        self._redis = redis
        self._pending: dict[uuid.UUID, _Pending] = {}

    def start(self, job_id: uuid.UUID, at: int) -> None:
        """A retried job's text goes on from `at` characters of its output (what its
        earlier attempts recorded): each piece says where it begins, so a follower
        that had more of it skips what it already has."""
        self._pending[job_id] = _Pending(at=at)

    def add(self, job_id: uuid.UUID, text: str, logprob: dict[str, Any] | None = None) -> None:
        pending = self._pending.setdefault(job_id, _Pending())
        if not pending.text and not pending.logprobs:
            pending.since = time.monotonic()
        pending.text += text
        pending.tokens += 1
        if logprob is not None:
            pending.logprobs.append(logprob)

    def flush(self, finals: dict[uuid.UUID, dict[str, Any]] | None = None) -> None:
        """Publish the pieces due (all of a finishing job's), then the finals."""
        finals = finals or {}
        now = time.monotonic()
        messages: list[tuple[str, bytes]] = []
        for job_id, pending in self._pending.items():
            # A job's first text goes at once (the time to first token), the rest coalesced.
            first = pending.index == 0
            due = first or now - pending.since >= FLUSH_S or pending.tokens >= FLUSH_TOKENS
            if (pending.text or pending.logprobs) and (due or job_id in finals):
                piece = {"index": pending.index, "at": pending.at, "text": pending.text,
                         "tokens": pending.tokens}  # fmt: skip
                if pending.logprobs:
                    piece["logprobs"] = pending.logprobs
                messages.append((channel(job_id), orjson.dumps(piece)))
                pending.index += 1
                pending.at += len(pending.text)
                pending.text, pending.tokens, pending.logprobs = "", 0, []
        for job_id, final in finals.items():
            index = self._pending.pop(job_id, _Pending()).index
            messages.append((channel(job_id), orjson.dumps({"index": index, **final})))
        if not messages:
            return
        pipe = self._redis().pipeline(transaction=False)
        for name, message in messages:
            pipe.publish(name, message)
        pipe.execute()

    def forget(self, job_id: uuid.UUID) -> None:
        self._pending.pop(job_id, None)


@dataclass(frozen=True)
class Followed:
    """What a follower passes on: new text, and at the end the job's status,
    finish reason and usage (`final`)."""

    text: str
    final: dict[str, Any] | None = None
    logprobs: tuple[dict[str, Any], ...] = ()  # the new tokens', when the call asked


def follow(
    redis: Any,
    job_id: uuid.UUID,
    ended: Callable[[], dict[str, Any] | None],
    timeout_s: float,
    check_s: float = 1.0,
) -> Iterator[Followed]:
    """The job's text as it comes, then its end. `ended()` reads the record: None
    while the job runs, else the final message's fields (its status, finish
    reason, usage and output). Each piece says where it begins in the output: one
    that overlaps what was passed on (a retry going on from what its dead attempt
    recorded, which may be less than it published) gives only its new end; a gap
    (a lost message) holds the text back until the end, whose whole output fills
    it: what is yielded, joined, is the output exactly. Redis or the database away for a while (a
    restart) is waited out: the messages lost meanwhile are such a gap, and the
    record is read again at the next check. Gives up after `timeout_s`
    (TimeoutError)."""
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel(job_id))
    sent, gap, given = "", False, 0
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + check_s
    try:
        while True:
            try:
                message = pubsub.get_message(timeout=min(check_s, 0.5))
            except RedisError:  # the next read connects again and subscribes anew
                gap, message = True, None
                time.sleep(min(check_s, 0.5))
            final: dict[str, Any] | None = None
            if message is not None and message.get("type") == "message":
                data = orjson.loads(message["data"])
                if data.get("final"):
                    final = data
                elif not gap:
                    new = _beyond(sent, data.get("at", len(sent)), data["text"])
                    gap = new is None
                    # (a retry's piece repeats none of the tokens already passed on)
                    entries = tuple(data.get("logprobs") or ()) if new is not None else ()
                    if new or entries:
                        sent += new or ""
                        given += len(entries)
                        yield Followed(new or "", logprobs=entries)
            now = time.monotonic()
            if final is None and now >= next_check:
                next_check = now + check_s
                try:
                    final = ended()
                except Exception as exc:
                    if not database_unavailable(exc):
                        raise
            if final is not None:
                output = final.get("output") or ""
                rest = output[len(sent) :] if output.startswith(sent) else ""
                yield Followed(rest, final, tuple((final.get("logprobs") or [])[given:]))
                return
            if now >= deadline:
                raise TimeoutError(f"job {job_id} did not finish within {timeout_s:g} s")
    finally:
        pubsub.close()


def _beyond(sent: str, at: int, text: str) -> str | None:
    """What of a piece beginning at `at` is new after `sent`; None when it leaves a
    gap, or disagrees with what was sent (a retry that sampled otherwise)."""
    if at > len(sent) or sent[at:] != text[: len(sent) - at]:
        return None
    return text[len(sent) - at :]
