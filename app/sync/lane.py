"""The sync lane: sync calls handed from the API to the workers over Redis.

A call of a worker-run model is not a job row first: the API pushes an entry
(its id, tenant, model, version, queue, deadline, reply channel and packed
inputs) onto its queue's lane, one Redis list per queue whatever models the
queue holds, bounded by SYNC_LANE_MAX_WAITING (full: the call is refused at
once), and only while a worker serves the queue (none: refused at once, 503).
Each worker child has one consumer per queue it serves: it moves entries
atomically from the lane to its own `taken` list (BLMOVE, then a script for the
rest of a micro-batch), runs them, and in one script publishes each answer and
journals the record of each call whose caller's process heard it
(app.sync.records), emptying `taken`. So at every moment an entry is in exactly
one place: waiting, taken by a live worker, or answered with its record
journaled. A model added while the service runs travels the lane of its queue at
once: nothing on the workers' side is per model.

A worker child keeps a liveness key (SYNC_LANE_LEASE_SECONDS) and, for each queue
it serves, the queue's `serving` key. Whoever finds a registered worker without
its liveness key (another worker, or an API process whose call waits too long)
reads its `taken` lists and settles each in one script: each entry back at the
front of its lane once (the entry says whether its model is idempotent, so even a
call of a model removed since is settled) or answered `lost` (503, retry later),
and the list gone, all at once and only if the list is still what was read (of
two callers, one settles it; a settler killed midway left it whole for the next).
A call whose worker died before answering is never run twice unasked, and never
left waiting.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson
import redis

from app.cards import ModelCard
from app.sync.records import JOURNAL

PREFIX = "inference:lane:"
WORKERS = PREFIX + "workers:queues"  # hash: worker id -> the queues it takes from
LOST = "lost"  # a Reply status: the call's worker died before answering it
MOST_CALLS = 64  # a micro-batch takes at most this many calls

# How a sync call of a model travels (`route`).
INLINE, LANE, JOB = "inline", "lane", "job"

NOT_SERVED, FULL = -1, -2  # what the push script answers instead of the lane's length

# KEYS[1]: the lane, KEYS[2]: its queue's serving key; ARGV[1]: the bound, then
# the entries. All pushed, or none: NOT_SERVED when no worker serves the queue,
# FULL when they would take the lane past its bound.
_PUSH = """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('LLEN', KEYS[1]) + #ARGV - 1 > tonumber(ARGV[1]) then return -2 end
local length = 0
for i = 2, #ARGV, 512 do
  length = redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 511, #ARGV)))
end
return length
"""
# KEYS[1]: the lane, KEYS[2]: taken; ARGV[1]: at most this many. Each entry opens
# with the most calls its model's micro-batch takes: the take ends there (a model
# that does not batch is taken one call at a time, so other workers take the next).
_TAKE = """
local taken, most = {}, tonumber(ARGV[1])
while #taken < most do
  local entry = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not entry then break end
  taken[#taken + 1] = entry
  local limit = tonumber(string.match(entry, '^(%d+) '))
  if limit and limit < most then most = limit end
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


# KEYS[1]: a dead worker's taken list, KEYS[2]: its queue's lane; ARGV[1]: the
# sha1 of the list as it was read (its entries joined by newlines), ARGV[2]: how
# many go back, then those entries, then (channel, answer) for each call lost.
# All done, or nothing (0) when the list changed since it was read.
_SETTLE = """
local found = redis.call('LRANGE', KEYS[1], 0, -1)
if #found == 0 or redis.sha1hex(table.concat(found, '\\n')) ~= ARGV[1] then return 0 end
local back = tonumber(ARGV[2])
for i = 3, 2 + back do redis.call('LPUSH', KEYS[2], ARGV[i]) end
for i = 3 + back, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
redis.call('DEL', KEYS[1])
return #found
"""


def route(card: ModelCard, lane_on: bool) -> str:
    """How a sync call of `card` travels, the one rule every door and process
    follows: INLINE (run in the calling process: `"execution": "inline"`, never for
    a model with its own code), LANE (worker-run, not generative, with SYNC_LANE
    on), else JOB (a job row first)."""
    if card.extra.get("execution") == INLINE and not card.code:
        return INLINE
    return LANE if lane_on and card.generation is None else JOB


def idempotent(card: ModelCard) -> bool:
    """Whether a call may run again after its worker died: the card's `idempotent`
    (a model is a pure function of its inputs unless its card says otherwise)."""
    return bool(card.extra.get("idempotent", True))


def batch_limit(card: ModelCard) -> int:
    """The most calls of `card` one micro-batch takes."""
    return max(1, min(MOST_CALLS, card.batching.max_batch_size))


@dataclass(frozen=True, slots=True)
class Entry:
    """One sync call on its way to a worker."""

    id: uuid.UUID  # also its record's job id
    tenant_id: int
    model: str
    version: str
    queue: str
    reply_to: str
    sent_at: float  # epoch seconds: the record's created_at
    deadline: float  # epoch seconds: its caller stops waiting then
    inputs: bytes  # packed arrays (app.runtime.tensors.pack)
    limit: int = 1  # the most calls of its model a micro-batch takes
    idempotent: bool = True  # may run again if its worker dies
    attempt: int = 1
    traceparent: str | None = None  # the trace its spans join (app.observability.tracing)


def encode(entry: Entry) -> bytes:
    """Its micro-batch limit, a JSON head line, then the packed inputs as they are."""
    head = {
        "id": str(entry.id), "tenant": entry.tenant_id, "model": entry.model,
        "version": entry.version, "queue": entry.queue, "reply_to": entry.reply_to,
        "sent_at": entry.sent_at, "deadline": entry.deadline, "idempotent": entry.idempotent,
        "attempt": entry.attempt, **({"tp": entry.traceparent} if entry.traceparent else {}),
    }  # fmt: skip
    return b"%d " % entry.limit + orjson.dumps(head) + b"\n" + entry.inputs


def decode(payload: bytes) -> Entry:
    limit, _, rest = payload.partition(b" ")
    head, _, inputs = rest.partition(b"\n")
    f = orjson.loads(head)
    return Entry(
        uuid.UUID(f["id"]), f["tenant"], f["model"], f["version"], f["queue"], f["reply_to"],
        f["sent_at"], f["deadline"], inputs, int(limit), f["idempotent"], f["attempt"],
        f.get("tp"),
    )  # fmt: skip


def lane_key(queue: str) -> str:
    """A queue's lane: only the workers serving that queue take from it (as only
    they take its wake-ups)."""
    return f"{PREFIX}waiting:{queue}"


def serving_key(queue: str) -> str:
    """Set (with the lease as its lifetime) by every worker child serving `queue`."""
    return f"{PREFIX}serving:{queue}"


def taken_key(worker: str, queue: str) -> str:
    return f"{PREFIX}taken:{worker}:{queue}"


def alive_key(worker: str) -> str:
    return f"{PREFIX}alive:{worker}"


class Lane:
    """The lane's Redis side, for the API (push, withdraw, recover) and the
    workers (take, answer, keep alive, recover)."""

    def __init__(self, client: redis.Redis, bound: int) -> None:
        self.client, self.bound = client, bound
        self._push = client.register_script(_PUSH)
        self._take = client.register_script(_TAKE)
        self._answer = client.register_script(_ANSWER)
        self._settle = client.register_script(_SETTLE)

    def push(self, queue: str, entries: list[bytes]) -> int:
        """Append these entries to the queue's lane, all or none, in one round trip:
        the lane's length, NOT_SERVED when no worker serves the queue, FULL when
        they would take it past its bound."""
        found: Any = self._push(keys=[lane_key(queue), serving_key(queue)],
                                args=[self.bound, *entries])  # fmt: skip
        return int(found)

    def withdraw(self, queue: str, entry: bytes) -> bool:
        """Take a waiting entry back (its caller stopped waiting), as it was pushed
        or as it waits again for its second attempt (its worker died); False when
        a worker has taken it."""
        again = encode(replace(decode(entry), attempt=2))
        pipe = self.client.pipeline(transaction=False)
        pipe.lrem(lane_key(queue), 1, entry)  # type: ignore[arg-type]
        pipe.lrem(lane_key(queue), 1, again)  # type: ignore[arg-type]
        return any(pipe.execute())

    def waiting(self, queue: str) -> int:
        return int(self.client.llen(lane_key(queue)))

    def served(self, queue: str) -> bool:
        """Whether a live worker serves `queue` now."""
        return bool(self.client.exists(serving_key(queue)))

    # The workers' side.

    def register(self, worker: str, queues: Iterable[str], lease_s: float) -> None:
        """Say this worker is alive and serves these queues, for one lease."""
        queues = list(queues)
        lease_ms = int(lease_s * 1000)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(alive_key(worker), b"1", px=lease_ms)
        pipe.hset(WORKERS, worker, " ".join(queues))
        for queue in queues:
            pipe.set(serving_key(queue), b"1", px=lease_ms)
        pipe.execute()

    def take(self, worker: str, queue: str, most: int, wait_s: int) -> list[bytes]:
        """Up to `most` entries of the queue's lane, moved to the worker's taken
        list; waits up to `wait_s` for the first. What waits already is taken in
        one step; only an empty lane blocks, and the entry that ends the wait is
        taken alone (the next take gathers what came meanwhile): no round trip
        between a lone call's arrival and its run."""
        waiting, taken = lane_key(queue), taken_key(worker, queue)
        found: Any = self._take(keys=[waiting, taken], args=[most])
        if found:
            return list(found)
        first: Any = self.client.blmove(waiting, taken, wait_s, "LEFT", "RIGHT")
        return [] if first is None else [first]

    def answer(
        self, worker: str, queue: str, calls: list[tuple[str, bytes, bytes]], journal: bool = True
    ) -> tuple[bytes | None, list[int]]:
        """Answer taken calls, each (reply channel, answer, record), and journal the
        records of those heard, in one step; the journal entry and the indexes of
        the calls heard (a caller's process gone hears nothing: no record).
        `journal` False (the fault suite's guard off): nothing is journaled."""
        args = [b"1" if journal else b"0", *(part for call in calls for part in call)]
        found = self._answer(keys=[taken_key(worker, queue), JOURNAL], args=args)
        return (found[0] or None), [int(n) - 1 for n in found[1:]]

    def dead_workers(self) -> dict[str, list[str]]:
        """Registered workers whose liveness key is gone, with their queues."""
        members: Any = self.client.hgetall(WORKERS)
        workers = {w.decode(): q.decode().split() for w, q in members.items()}
        if not workers:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for worker in workers:
            pipe.exists(alive_key(worker))
        alive = pipe.execute()
        return {w: q for (w, q), up in zip(workers.items(), alive, strict=True) if not up}

    def taken(self, worker: str, queue: str) -> list[bytes]:
        """What `worker` has taken from the queue's lane and not answered yet."""
        return list(self.client.lrange(taken_key(worker, queue), 0, -1))  # type: ignore[arg-type]

    def settle(
        self, worker: str, queue: str, read: list[bytes], back: list[Entry],
        lost: list[tuple[str, bytes]],
    ) -> bool:  # fmt: skip
        """Settle a dead worker's taken list as `read` (`taken`) in one step: the
        `back` entries at the front of the lane for their next attempt, each `lost`
        answer (reply channel, encoded reply) published, the list gone. False, and
        nothing done, when the list is no longer what was read (settled already,
        or its worker was alive after all and answered)."""
        digest = hashlib.sha1(b"\n".join(read)).hexdigest()  # a check, not a secret
        again = [encode(replace(entry, attempt=entry.attempt + 1)) for entry in back]
        args = [digest, len(again), *again, *(part for call in lost for part in call)]
        done: Any = self._settle(keys=[taken_key(worker, queue), lane_key(queue)], args=args)
        return bool(done)

    def let_go(self, worker: str) -> None:
        """Forget a registered worker whose liveness key is gone (its lists settled)."""
        if not self.client.exists(alive_key(worker)):
            self.client.hdel(WORKERS, worker)

    def forget(self, worker: str) -> None:
        """A worker stopping: its liveness key goes at once, so whatever it still
        had taken is recovered now rather than once its lease lapsed."""
        self.client.delete(alive_key(worker))
