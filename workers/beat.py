"""Beat's scheduler: one pending message per sweep (see app.platform.periodic),
sent only by the beat holding the control lease (see app.platform.fencing)."""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from app.platform import periodic as control
from app.platform.fencing import Lease

logger = logging.getLogger(__name__)

# How often the lease is renewed (or, standing by, tried for).
RENEW_EVERY_S = 1.0


class OnePendingScheduler(PersistentScheduler):
    """Sends the sweeps while it holds the control lease, each message carrying the
    lease's term; skips a due entry while its last message waits unconsumed."""

    _lease: Lease | None = None
    _renew_at = 0.0

    def lease(self) -> Lease:
        if self._lease is None:
            container = self.app.services
            settings = container.settings
            self._lease = Lease(
                container.parts.database.engine,
                settings.control_queue,
                settings.control_lease_seconds,
            )
        return self._lease

    def tick(self, *args: Any, **kwargs: Any) -> float:
        now = time.monotonic()
        if now >= self._renew_at:
            self._renew_at = now + RENEW_EVERY_S
            self.lease().keep()
        if self.lease().held() is None:  # standing by: try again in a second
            return RENEW_EVERY_S
        delay: float = super().tick(*args, **kwargs)
        return min(delay, max(0.0, self._renew_at - now))

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
        super().close()

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        queue, ttl = entry.options.get("queue"), entry.options.get("expires")
        redis_url = self.app.conf.get("inference_redis_url")
        token = self.lease().held()
        if token is None:
            return
        if queue and ttl and redis_url:
            if not control.mark_pending(redis_url, queue, entry.task, int(ttl), token):
                logger.debug("Scheduler: %s still pending; not sent again", entry.name)
                return
            fenced = copy.copy(entry)
            fenced.kwargs = {**entry.kwargs, "fence": token}
            try:
                self.apply_async(fenced, producer=producer, advance=False)
            except Exception:
                control.clear_pending(redis_url, queue, entry.task, token)  # again next tick
                logger.exception("Scheduler: could not send %s", entry.name)
            else:
                # DEBUG: a sweep is sent every second; one that does something says so.
                logger.debug("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
            return
        super().apply_entry(entry, producer=producer)
