"""The control plane: beat's periodic sweeps, on a queue of their own.

Sweeps (taking back dead workers' jobs, expiring deadlines, sending due
webhooks, firing schedules, purging) travel on CONTROL_QUEUE, served by the
control worker, never behind inference jobs: a backlog of jobs must not stop
them for every tenant. At most one message of each sweep is pending or running:
beat sets a Redis flag with NX before it sends one (and skips the send while
the flag is there), the task deletes it when it ends, so a late sweep covers
every tick it missed, and a slow one (a schedule exporting a large file) never
takes a second thread from the others. The flag expires, and so does the
message (the same TTL, Celery's `expires`), so a lost message delays a sweep
but never stops it, and a stale one is dropped rather than run late. Flags are
per control lease term (app.platform.fencing).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import redis

from app.platform.broker import redis_client
from app.platform.settings import Settings

PENDING_TTL_MIN_S = 30.0


def pending_ttl(interval_s: float) -> int:
    """How long one pending sweep message may wait before a new one is sent."""
    return int(max(PENDING_TTL_MIN_S, 2 * interval_s))


def periodic(task: str, every_s: float, settings: Settings) -> dict[str, Any]:
    """A beat_schedule entry on the control queue, its message expiring with its flag."""
    options = {"queue": settings.control_queue, "expires": pending_ttl(every_s)}
    return {"task": task, "schedule": every_s, "options": options}


def _flag(queue: str, task: str, term: int | None) -> str:
    """One flag per lease term: a beat that takes the control lease over sends at
    once, not after the flags of messages a frozen holder's worker sits on expire."""
    suffix = "" if term is None else f":{term}"
    return f"inference:pending:{queue}:{task}{suffix}"


@functools.lru_cache(maxsize=8)
def _client(redis_url: str) -> redis.Redis:
    return redis_client(redis_url)


def mark_pending(
    redis_url: str, queue: str, task: str, ttl_s: int, term: int | None = None
) -> bool:
    """True when no message of `task` is pending in this lease term (the caller
    sends one now)."""
    try:
        return bool(_client(redis_url).set(_flag(queue, task, term), "1", nx=True, ex=ttl_s))
    except redis.RedisError:
        return True  # the send will say whether the broker is there


def clear_pending(redis_url: str, queue: str, task: str, term: int | None = None) -> None:
    """The sweep is over: the next tick may send another."""
    with contextlib.suppress(redis.RedisError):  # else it expires by itself
        _client(redis_url).delete(_flag(queue, task, term))
