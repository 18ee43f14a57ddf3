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
            for queue in queues:
                settled += self._settle(worker, queue)
            self._lane.let_go(worker)
        return settled

    def _settle(self, worker: str, queue: str) -> int:
        """One dead worker's calls taken from one queue's lane, settled in one step
        (nothing is held only by this process between the read and the settling:
        were it killed, the next recovery finds the list as it was)."""
        read = self._lane.taken(worker, queue)
        if not read:
            return 0
        entries = [lane.decode(raw) for raw in read]
        back = [e for e in entries if _again(e)]
        lost = [(e.reply_to, replies.encode(_lost(e))) for e in entries if not _again(e)]
        if not self._lane.settle(worker, queue, read, back, lost):
            return 0  # another caller settled it first, or its worker answered after all
        logger.warning("worker %s died with %d sync call(s) taken: %d put back, %d lost",
                       worker, len(read), len(back), len(lost))  # fmt: skip
        return len(read)


def _again(entry: Entry) -> bool:
    """Whether a dead worker's call runs once more: its first attempt, of a model
    whose card says it may."""
    return entry.attempt < 2 and entry.idempotent


def _lost(entry: Entry) -> Reply:
    return Reply(entry.id, lane.LOST, "worker_lost",
                 f"the worker running this call of model {entry.model}:{entry.version} stopped "
                 "before answering it", None)  # fmt: skip
