"""Settling the sync calls of workers that died (app.sync.lane): run by every
worker's housekeeping, and by an API process whose call waits too long.

Each entry says whether its model is idempotent, so nothing here reads the model
repository: a call of a model unloaded or removed since it was taken is settled
like any other (put back, it is answered `model_unavailable` naming its model by
the worker that takes it next).
"""

from __future__ import annotations

import logging

from app.sync import lane, replies
from app.sync.lane import Entry, Lane
from app.sync.replies import Reply

logger = logging.getLogger(__name__)


class Recovery:
    """Finds workers whose liveness key lapsed and settles the calls they had
    taken: once more at the front of the lane where the model is idempotent and
    it was the first attempt, else answered `lost`."""

    def __init__(self, lane_: Lane) -> None:
        self._lane = lane_

    def run(self) -> int:
        """Settle dead workers' calls; how many."""
        settled = 0
        for worker, queues in self._lane.dead_workers().items():
            seized = self._lane.seize(worker, queues)
            lost: list[tuple[str, Reply]] = []
            for raw in seized:
                entry = lane.decode(raw)
                if entry.attempt < 2 and entry.idempotent:
                    self._lane.put_back(entry)
                else:
                    lost.append((entry.reply_to, _lost(entry)))
            if lost:
                replies.publish(self._lane.client, lost)
            if seized:
                logger.warning("worker %s died with %d sync call(s) taken: %d put back, %d lost",
                               worker, len(seized), len(seized) - len(lost), len(lost))  # fmt: skip
            settled += len(seized)
        return settled


def _lost(entry: Entry) -> Reply:
    return Reply(entry.id, lane.LOST, "worker_lost",
                 f"the worker running this call of model {entry.model}:{entry.version} stopped "
                 "before answering it", None)  # fmt: skip
