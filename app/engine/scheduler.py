"""The decode loop's policy: when it claims, looks for cancellations, shares its
slots, counts and stops; which generations it admits, pauses and resumes.

No I/O: the loop (app.engine.core) asks `turn` what to do at each
pass (`turn`, then `then` once it has claimed), does the claims, writes and
publishing itself, and tells the scheduler what happened (`admitted`,
`claimed`, `left`, ...). So the policy is read, and
tested with a clock of the test's own, without PostgreSQL, Redis or a model.

Timers: a loop with free slots claims when a wake-up is pending for its model
(`pending`, looked at every pass, or every WATCH_S while idle) and at least every
CLAIM_EVERY_S (jobs back from a retry or the sweep come without one); it looks
for cancellations (and a hand-over request) every CANCELS_EVERY_S while it has
generations, for tenants waiting without a slot every SHARE_EVERY_S while every
slot is taken (app.generation.sharing), counts tokens every COUNT_EVERY_S, and
renews its machine lock every LOCK_RENEW_S. It stops once idle past its linger;
idle past its drain time, it also stops as soon as other work waits for its
worker, or the worker shuts down (`backlog`, looked at every BACKLOG_EVERY_S).
So the next call of its model finds it running, with its model loaded and its
prefixes kept, while the process is not needed elsewhere.

A loop serves one version of its model (its engine and chat format are that
version's). Every VERSIONS_EVERY_S, and after a claim that found nothing, it
looks whether a job of another version waits (`look`); if so it closes: it
claims no more, finishes what it runs and stops, and the next loop serves the
version first in line. So a job pinned to an older version waits for the
running generations, never for the other version's queue to empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.generation.sharing import Holder, Waiter, preemptions

WATCH_S = 0.005
CLAIM_EVERY_S = 0.5
CANCELS_EVERY_S = 0.25
SHARE_EVERY_S = 0.1
COUNT_EVERY_S = 0.25
LOCK_RENEW_S = 2.0  # a fifth of the lock's life (app.engine.loop.LOCK_S)
VERSIONS_EVERY_S = 1.0
BACKLOG_EVERY_S = 0.25


@dataclass(frozen=True)
class Turn:
    """What the loop does first at a pass, in this order."""

    renew_lock: bool = False
    resume: int = 0  # paused generations to put back (`resumable` names them)
    claim: int = 0  # jobs to claim at most (a wake-up or the timer is due, slots free)
    share: bool = False  # every slot taken and a claim due: look for tenants waiting
    look: bool = False  # look for jobs of another version waiting (then `close`)


@dataclass(frozen=True)
class Then:
    """What it does next, once it has claimed."""

    stop: bool = False  # idle past its linger or its drain time: the loop ends
    idle: bool = False  # nothing runs: wait WATCH_S and pass again
    cancels: bool = False  # look for cancellations and a hand-over request
    count: bool = False  # count tokens, slots and prefix lookups

    @property
    def step(self) -> bool:
        return not (self.stop or self.idle)


@dataclass
class Scheduler:
    slots: int
    started: float
    drain_s: float
    linger_s: float  # 0: end at the first pass with nothing running after a claim
    holders: dict[Any, Holder] = field(default_factory=dict)  # admitted, paused ones too
    paused: list[Any] = field(default_factory=list)  # in the order they go on
    closing: bool = False  # another version waits: claim no more, stop once empty
    _next: dict[str, float] = field(default_factory=dict)
    _idle_until: float = 0.0

    def __post_init__(self) -> None:
        self._idle_until = self.started + self.linger_s
        self._next = dict.fromkeys(("lock", "claim", "cancels", "share", "count", "backlog"), 0.0)
        self._next["versions"] = self.started + VERSIONS_EVERY_S  # (it starts on the first)

    def turn(self, now: float, free: int, pending: Callable[[], bool]) -> Turn:
        """This pass's first moves: `free` slots of the engine; `pending()` says
        whether a wake-up waits (asked only when the timer has not made a claim due)."""
        due = self._next
        renew = now >= due["lock"]
        if renew:
            due["lock"] = now + LOCK_RENEW_S
        resume = min(len(self.paused), free)
        free -= resume
        # It takes new generations while it runs, busy or lingering (they join the
        # batch at once); the drain time only lets other work end its lingering.
        claim_due = not self.closing and (now >= due["claim"] or pending())
        share = claim_due and free <= 0 and now >= due["share"]
        if share:
            due["share"] = now + SHARE_EVERY_S
        look = not self.closing and now >= due["versions"]
        if look:
            due["versions"] = now + VERSIONS_EVERY_S
        return Turn(renew, resume, free if claim_due and free > 0 else 0, share, look)

    def then(self, now: float, backlog: Callable[[], bool] = lambda: False) -> Then:
        """After the claims: step, or wait, or stop. `backlog()` says whether other
        work waits for the worker (asked only idle past the drain time, on its timer)."""
        if not self.holders:
            ended = self.closing or now >= self._idle_until
            if not ended and now >= self.started + self.drain_s and now >= self._next["backlog"]:
                self._next["backlog"] = now + BACKLOG_EVERY_S
                ended = backlog()
            return Then(stop=ended, idle=not ended)
        self._idle_until = now + self.linger_s
        due = self._next
        cancels, count = now >= due["cancels"], now >= due["count"]
        if cancels:
            due["cancels"] = now + CANCELS_EVERY_S
        if count:
            due["count"] = now + COUNT_EVERY_S
        return Then(cancels=cancels, count=count)

    def claimed(self, now: float, more: bool, took: int = 1) -> None:
        """A claim was made (`took` jobs): the next at once if the queue held more,
        else on the timer (or a wake-up). One that found none looks at the next
        pass whether the wake-up was for another version's job."""
        self._next["claim"] = now if more else now + CLAIM_EVERY_S
        if not took:
            self._next["versions"] = now

    def close(self) -> None:
        """A job of another version waits: take no more, stop once the running end."""
        self.closing = True

    def admitted(self, key: Any, tenant: int | None, priority: int, now: float) -> None:
        self.holders[key] = Holder(key, tenant or 0, priority, now)

    def preempt(self, waiters: list[Waiter]) -> list[tuple[Holder, Waiter]]:
        """Which running generations to pause for which waiting tenants' jobs."""
        running = [h for key, h in self.holders.items() if key not in self.paused]
        return preemptions(self.slots, running, waiters)

    def pause(self, key: Any) -> None:
        self.paused.append(key)

    def resumable(self, n: int, now: float) -> list[Any]:
        """The first `n` paused generations, out of the paused list (first paused
        first), as joining now."""
        keys, self.paused = self.paused[:n], self.paused[n:]
        for key in keys:
            if (holder := self.holders.get(key)) is not None:
                self.holders[key] = Holder(key, holder.tenant, holder.priority, now)
        return keys

    def left(self, key: Any) -> None:
        """A generation ended (finished, cancelled, failed or handed over)."""
        self.holders.pop(key, None)
        if key in self.paused:
            self.paused.remove(key)

    def clear(self) -> None:
        self.holders.clear()
        self.paused.clear()
