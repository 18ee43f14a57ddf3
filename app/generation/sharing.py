"""How a decode loop's slots are shared between tenants.

Claims already take tenants in turn (app.jobs.claims), but a generation holds
its slot for as long as it writes: a tenant that filled every slot with long
generations would keep another tenant's first one waiting for minutes. So a
loop whose slots are all taken pauses some of the tenant holding the most,
to start a waiting tenant's job in its place: each tenant with work gets at
least `slots // tenants` (one at least) when it wants them. A paused
generation keeps its tokens and goes on (its prompt and text prefilled again)
as soon as a slot is free. A job never pauses one of higher priority.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Holder:
    """A generation in a slot; `joined`: when (the youngest pauses first: it lost
    the least work, since a pause costs a prefill of what it made)."""

    key: Any
    tenant: int
    priority: int
    joined: float


@dataclass(frozen=True)
class Waiter:
    """A tenant's next queued generation."""

    key: Any
    tenant: int
    priority: int


def fair_share(slots: int, tenants: int) -> int:
    return max(1, slots // max(1, tenants))


def preemptions(
    slots: int, holders: list[Holder], waiters: list[Waiter]
) -> list[tuple[Holder, Waiter]]:
    """Which generations to pause, each for the waiting job that takes its slot.

    A waiter gets a slot while its tenant holds fewer than its fair share, from
    the tenant holding the most above its share, never of a higher priority."""
    held = Counter(h.tenant for h in holders)
    share = fair_share(slots, len(set(held) | {w.tenant for w in waiters}))
    pool = sorted(holders, key=lambda h: (h.priority, -h.joined))
    pairs: list[tuple[Holder, Waiter]] = []
    for waiter in sorted(waiters, key=lambda w: -w.priority):
        if held[waiter.tenant] >= share:
            continue
        over = [h for h in pool if held[h.tenant] > share and h.priority <= waiter.priority]
        if not over:
            continue
        most = max(held[h.tenant] for h in over)
        victim = next(h for h in over if held[h.tenant] == most)
        pool.remove(victim)
        held[victim.tenant] -= 1
        held[waiter.tenant] += 1
        pairs.append((victim, waiter))
    return pairs
