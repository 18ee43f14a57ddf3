"""How the client's waiting calls (long-polls, event streams, following a batch)
bound their time and ride out what a waiting client meets: 429 and 503 (no
sooner than their Retry-After), 502 and 504 from a proxy, and dropped
connections, with exponential backoff and jitter."""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

import requests

from inference_client.errors import ApiError, WaitTimeout

if TYPE_CHECKING:
    from inference_client.resources import Batch, Job

log = logging.getLogger("inference_client")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
BACKOFF_FIRST_S = 0.5


class Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def cap(self, seconds: float) -> float:
        left = self.left()
        return seconds if left is None else min(seconds, left)


class Retry:
    """Exponential backoff with jitter between tries of one waiting call; a
    server's Retry-After is honoured as given."""

    def __init__(self, cap_s: float, what: str) -> None:
        self.cap_s, self.what, self.attempt = cap_s, what, 0

    def reset(self) -> None:
        self.attempt = 0

    def pause(self, exc: Exception, deadline: Deadline, last: Job | Batch | None) -> None:
        """Sleep before the next try, or re-raise `exc` when it is not worth
        retrying; WaitTimeout when the next try would come past the deadline."""
        if isinstance(exc, ApiError):
            if exc.status not in RETRY_STATUSES:
                raise exc
            hinted = exc.retry_after
        elif isinstance(exc, requests.ConnectionError | requests.Timeout):
            hinted = None  # ChunkedEncodingError (a cut stream) is a ConnectionError too
        else:
            raise exc
        ceiling = min(self.cap_s, BACKOFF_FIRST_S * 2**self.attempt)
        delay = hinted if hinted is not None else random.uniform(ceiling / 2, ceiling)
        self.attempt += 1
        left = deadline.left()
        if left is not None and delay >= left:
            raise WaitTimeout(f"{self.what}: gave up, the time ran out ({exc})", last) from exc
        log.warning("%s: %s; trying again in %.1f s", self.what, exc, delay)
        time.sleep(delay)
