"""The sync lane: sync calls handed from the API to the workers over Redis.

A call worker-run models answer is not a job row first: the API pushes an entry
(its id, tenant, model, deadline, reply channel and packed inputs) onto its
model's lane, a Redis list bounded by SYNC_LANE_MAX_WAITING (full: the call is
refused at once). A worker's lane thread moves entries atomically from the lane
to its own `taken` list (BLMOVE, then a script for the rest of a micro-batch),
runs them, and in one script publishes each answer and journals the record of
each call whose caller's process heard it (app.sync.records), emptying `taken`.
So at every moment an entry is in exactly one place: waiting, taken by a live
worker, or answered with its record journaled.

A worker's lane threads keep a liveness key (SYNC_LANE_LEASE_SECONDS). Whoever
finds a registered worker without one (another worker, or an API process whose
call waits too long) takes its `taken` lists with RENAME, so only one does, and
puts each entry back at the front of its lane once (its model idempotent: the
card says) or answers it `lost` (503, retry later): a call whose worker died
before answering is never run twice unasked, and never left waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson
import redis

from app.sync.records import JOURNAL

PREFIX = "inference:lane:"
WORKERS = PREFIX + "workers"  # set: the worker ids whose lanes' taken lists may hold entries
LOST = "lost"  # a Reply status: the call's worker died before answering it

# KEYS[1]: the lane, KEYS[2]: taken; ARGV[1]: at most this many more.
_TAKE_MORE = """
local taken = {}
for _ = 1, tonumber(ARGV[1]) do
  local entry = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not entry then break end
  taken[#taken + 1] = entry
end
return taken
"""
# KEYS[1]: taken, KEYS[2]: the journal; ARGV: '1' to journal (else '0'), then
# (channel, answer, record) for each call. Publishes each answer; journals the
# record of each call a process heard (one stream entry); empties taken. Returns
# the journal entry's id ('' for none), then the (1-based) numbers of the calls heard.
_ANSWER = """
local fields, heard = {}, {}
for i = 2, #ARGV, 3 do
  if redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) > 0 then
    heard[#heard + 1] = (i + 1) / 3
    fields[#fields + 1] = tostring(#heard)
    fields[#fields + 1] = ARGV[i + 2]
  end
end
redis.call('DEL', KEYS[1])
if #fields == 0 or ARGV[1] ~= '1' then return {'', unpack(heard)} end
local entry = redis.call('XADD', KEYS[2], '*', unpack(fields))
return {entry, unpack(heard)}
"""


@dataclass(frozen=True, slots=True)
class Entry:
    """One sync call on its way to a worker."""

    id: uuid.UUID  # also its record's job id
    tenant_id: int
    model: str
    version: str
    reply_to: str
    sent_at: float  # epoch seconds: the record's created_at
    deadline: float  # epoch seconds: its caller stops waiting then
    inputs: bytes  # packed arrays (app.runtime.tensors.pack)
    attempt: int = 1


def encode(entry: Entry) -> bytes:
    """A JSON head line, then the packed inputs as they are."""
    head = {
        "id": str(entry.id), "tenant": entry.tenant_id, "model": entry.model,
        "version": entry.version, "reply_to": entry.reply_to, "sent_at": entry.sent_at,
        "deadline": entry.deadline, "attempt": entry.attempt,
    }  # fmt: skip
    return orjson.dumps(head) + b"\n" + entry.inputs


def decode(payload: bytes) -> Entry:
    head, _, inputs = payload.partition(b"\n")
    f = orjson.loads(head)
    return Entry(
        uuid.UUID(f["id"]), f["tenant"], f["model"], f["version"], f["reply_to"],
        f["sent_at"], f["deadline"], inputs, f["attempt"],
    )  # fmt: skip


def lane_key(queue: str, model: str) -> str:
    """A model's lane, under the queue its card names: only the workers serving
    that queue take from it (as only they take its wake-ups)."""
    return f"{PREFIX}waiting:{queue}:{model}"


def taken_key(worker: str, model: str) -> str:
    return f"{PREFIX}taken:{worker}:{model}"


def alive_key(worker: str) -> str:
    return f"{PREFIX}alive:{worker}"


class Lane:
    """The lane's Redis side, for the API (push, withdraw, recover) and the
    workers (take, keep alive, recover)."""

    def __init__(self, client: redis.Redis, bound: int, route: Callable[[str], str]) -> None:
        """`route`: a model's queue (app.execution.dispatch.Dispatcher.queue_for)."""
        self.client, self.bound, self._route = client, bound, route
        self._take_more = client.register_script(_TAKE_MORE)
        self._answer = client.register_script(_ANSWER)

    def push(self, model: str, entries: list[bytes]) -> bool:
        """Append these entries to the model's lane, all or none: False when that
        took it past its bound (they are taken out again at once). A plain RPUSH,
        the cheapest round trip, on the path of every call."""
        key = self.key(model)
        if int(self.client.rpush(key, *entries)) <= self.bound:
            return True
        pipe = self.client.pipeline(transaction=False)
        for entry in entries:
            pipe.lrem(key, -1, entry)  # type: ignore[arg-type]
        pipe.execute()
        return False

    def withdraw(self, model: str, entry: bytes) -> bool:
        """Take a waiting entry back (its caller stopped waiting); False when a
        worker has taken it already."""
        return bool(self.client.lrem(self.key(model), 1, entry))  # type: ignore[arg-type]

    def waiting(self, model: str) -> int:
        return int(self.client.llen(self.key(model)))

    def key(self, model: str) -> str:
        return lane_key(self._route(model), model)

    # The workers' side.

    def register(self, worker: str, lease_s: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(alive_key(worker), b"1", px=int(lease_s * 1000))
        pipe.sadd(WORKERS, worker)
        pipe.execute()

    def take(self, worker: str, model: str, most: int, wait_s: int) -> list[bytes]:
        """Up to `most` entries of the model's lane, moved to the worker's taken
        list; waits up to `wait_s` for the first. What waits already is taken in
        one step; only an empty lane blocks, and the entry that ends the wait is
        taken alone (the next take gathers what came meanwhile): no round trip
        between a lone call's arrival and its run."""
        taken, waiting = taken_key(worker, model), self.key(model)
        if most > 1:
            found: Any = self._take_more(keys=[waiting, taken], args=[most])
            if found:
                return list(found)
        first: Any = self.client.blmove(waiting, taken, wait_s, "LEFT", "RIGHT")
        return [] if first is None else [first]

    def answer(
        self, worker: str, model: str, calls: list[tuple[str, bytes, bytes]], journal: bool = True
    ) -> tuple[bytes | None, list[int]]:
        """Answer taken calls, each (reply channel, answer, record), and journal the
        records of those heard, in one step; the journal entry and the indexes of
        the calls heard (a caller's process gone hears nothing: no record).
        `journal` False (the fault suite's guard off): nothing is journaled."""
        args = [b"1" if journal else b"0", *(part for call in calls for part in call)]
        found = self._answer(keys=[taken_key(worker, model), JOURNAL], args=args)
        return (found[0] or None), [int(n) - 1 for n in found[1:]]

    def dead_workers(self) -> list[str]:
        """Registered workers whose liveness key is gone."""
        members: Any = self.client.smembers(WORKERS)
        workers = [w.decode() for w in members]
        if not workers:
            return []
        pipe = self.client.pipeline(transaction=False)
        for worker in workers:
            pipe.exists(alive_key(worker))
        return [w for w, alive in zip(workers, pipe.execute(), strict=True) if not alive]

    def seize(self, worker: str, models: Iterable[str]) -> list[bytes]:
        """The entries a dead worker had taken, now this caller's alone (RENAME:
        of two callers, one gets each list); the worker is forgotten."""
        seized: list[bytes] = []
        for model in models:
            mine = f"{PREFIX}seized:{uuid.uuid4().hex}"
            try:
                self.client.rename(taken_key(worker, model), mine)
            except redis.ResponseError:  # no such list: nothing taken, or seized already
                continue
            pipe = self.client.pipeline(transaction=True)
            pipe.lrange(mine, 0, -1)
            pipe.delete(mine)
            seized += pipe.execute()[0]
        if not self.client.exists(alive_key(worker)):
            self.client.srem(WORKERS, worker)
        return seized

    def put_back(self, entry: Entry) -> bytes:
        """An entry of a dead worker, at the front of its lane for its second and
        last attempt (past the bound: it was admitted already)."""
        again = encode(replace(entry, attempt=entry.attempt + 1))
        self.client.lpush(self.key(entry.model), again)
        return again
