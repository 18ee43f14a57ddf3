"""Tokens per minute: what each tenant's generations took (prompt plus completion).

The decoding workers count the tokens as they process them, into one Redis hash
per tenant with a field a second (`HINCRBY`, batched per decode step), so the
count is shared by every worker machine and every API process reads the same
minute. The budget (a tenant's `max_tokens_per_minute`, else
TENANT_MAX_TOKENS_PER_MINUTE) is checked when a generation is submitted: once
the last 60 seconds hold the budget, the submit is refused with the seconds
until enough of them have aged out. Generations already admitted run to their
end (their tokens count), so a tenant can overshoot by what it had running;
its in-flight quota bounds that.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy.engine import make_url

logger = logging.getLogger(__name__)

WINDOW_S = 60


def namespace(database_url: str) -> str:
    """The counts' namespace: the database's name (its tenants' ids are what the
    counts are keyed by; two services sharing a Redis keep theirs apart)."""
    return make_url(database_url).database or ""


@dataclass(frozen=True)
class TokenWindow:
    """A tenant's tokens in the last minute, and the seconds until `limit` of
    them would leave room (0: there is room now)."""

    used: int
    retry_after: int


class TokenMeter:
    """Counts (workers) and reads (API) the tenants' tokens of the last minute.
    `redis` gives the client to use; `clock` wall-clock seconds (tests move it)."""

    def __init__(
        self, redis_client: Callable[[], Any], space: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._redis, self.space, self.clock = redis_client, space, clock

    def _key(self, tenant_id: int) -> str:
        return f"quota:tokens:{self.space}:{tenant_id}"

    def add(self, tokens: dict[int, int]) -> None:
        """Count tokens per tenant, in one round trip. A Redis that does not
        answer costs the count, never the generation (the budget fails open)."""
        tokens = {tenant: n for tenant, n in tokens.items() if n > 0}
        if not tokens:
            return
        second = int(self.clock())
        try:
            pipe = self._redis().pipeline(transaction=False)
            for tenant, n in tokens.items():
                pipe.hincrby(self._key(tenant), str(second), n)
                pipe.expire(self._key(tenant), 2 * WINDOW_S)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("tokens of %d tenant(s) not counted: %s", len(tokens), exc)

    def window(self, tenant_id: int, limit: int | None = None) -> TokenWindow:
        """The last minute's tokens; with `limit`, when the count is back under it.
        Seconds that left the window are deleted on the way."""
        now = self.clock()
        try:
            fields = self._redis().hgetall(self._key(tenant_id))
        except redis.RedisError as exc:
            logger.warning("tokens of tenant %s not read: %s", tenant_id, exc)
            return TokenWindow(0, 0)
        seconds = sorted((int(s), int(n)) for s, n in fields.items())
        old = [s for s, _ in seconds if s <= now - WINDOW_S]
        if old:
            # (else they expire with the key, and are not counted meanwhile)
            with contextlib.suppress(redis.RedisError):
                self._redis().hdel(self._key(tenant_id), *map(str, old))
        live = [(s, n) for s, n in seconds if s > now - WINDOW_S]
        used = sum(n for _, n in live)
        if limit is None or used < limit:
            return TokenWindow(used, 0)
        left = used
        for second, n in live:  # the oldest seconds leave first
            left -= n
            if left < limit:
                return TokenWindow(used, max(1, math.ceil(second + WINDOW_S - now)))
        return TokenWindow(used, WINDOW_S)  # (not reached: the last second's leaving empties it)
