"""Requests that hold a thread while they wait (event streams, long-polls,
`Prefer: wait`, sync calls through the workers, gRPC streams) are counted per process:
each tenant may hold MAX_WAITS_PER_TENANT, all tenants together MAX_WAITS,
which is kept below the process's threads so ordinary requests (a submit,
a readiness check) always find one free. Beyond either, TooManyWaits.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from app.errors import DomainError, TooManyWaits


@dataclass(frozen=True)
class Wording:
    """What a Holds counts, which settings bound it, and the error that refuses one more."""

    what: str = "event streams, long-polls, sync calls or gRPC streams"
    per_tenant: str = "MAX_WAITS_PER_TENANT; on the gRPC door GRPC_MAX_WAITS_PER_TENANT"
    total: str = "MAX_WAITS; on the gRPC door GRPC_MAX_WAITS"
    advice: str = "close one, or poll without waiting"
    refusal: type[DomainError] = TooManyWaits


class Holds:
    def __init__(self, per_tenant: int, total: int, wording: Wording = Wording()) -> None:
        self.per_tenant, self.total, self.wording = per_tenant, total, wording
        self._lock = threading.Lock()
        self._held: Counter[int] = Counter()
        self._count = 0  # the sum of _held, kept: every authenticated request acquires

    def acquire(self, tenant_id: int) -> Callable[[], None]:
        """Count one more waiting request of the tenant; returns its release
        (idempotent). TooManyWaits when a limit is reached."""
        words = self.wording
        with self._lock:
            if self._held[tenant_id] >= self.per_tenant:
                raise words.refusal(
                    f"you already have {self.per_tenant} {words.what} open on this server "
                    f"({words.per_tenant}); {words.advice}",
                    retry_after=1, limit=self.per_tenant,
                )  # fmt: skip
            if self._count >= self.total:
                raise words.refusal(
                    f"this server already holds {self.total} {words.what} ({words.total}); "
                    f"retry shortly, or {words.advice}",
                    retry_after=1, limit=self.total,
                )  # fmt: skip
            self._held[tenant_id] += 1
            self._count += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self._count -= 1
                    self._held[tenant_id] -= 1
                    if self._held[tenant_id] <= 0:
                        del self._held[tenant_id]

        return release

    @contextmanager
    def holding(self, tenant_id: int) -> Iterator[None]:
        release = self.acquire(tenant_id)
        try:
            yield
        finally:
            release()
