"""Beat's scheduler: one pending message per sweep (see app.platform.periodic)."""

from __future__ import annotations

import logging
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from app.platform import periodic as control

logger = logging.getLogger(__name__)


class OnePendingScheduler(PersistentScheduler):
    """Skips a due entry while its last message waits unconsumed on its queue."""

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        queue, ttl = entry.options.get("queue"), entry.options.get("expires")
        redis_url = self.app.conf.get("inference_redis_url")
        if queue and ttl and redis_url:
            if not control.mark_pending(redis_url, queue, entry.task, int(ttl)):
                logger.debug("Scheduler: %s still pending; not sent again", entry.name)
                return
            try:
                self.apply_async(entry, producer=producer, advance=False)
            except Exception:
                control.clear_pending(redis_url, queue, entry.task)  # try again next tick
                logger.exception("Scheduler: could not send %s", entry.name)
            else:
                # DEBUG: a sweep is sent every second; one that does something says so.
                logger.debug("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
            return
        super().apply_entry(entry, producer=producer)
