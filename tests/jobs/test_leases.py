"""The process's lease keeper: renewals while a batch runs, the time limit, one thread."""

from __future__ import annotations

import threading
import time
import uuid

from app.execution.leases import LeaseKeeper
from app.jobs.claims import ClaimedJob


def jobs(n: int) -> list[ClaimedJob]:
    return [ClaimedJob(uuid.uuid4(), "digits", "1", None, b"", 1, 3) for _ in range(n)]


class Renewals:
    def __init__(self) -> None:
        self.calls: list[tuple[float, list[uuid.UUID]]] = []

    def __call__(self, held: list[ClaimedJob]) -> set[uuid.UUID]:
        self.calls.append((time.monotonic(), [j.id for j in held]))
        return {j.id for j in held}


def test_leases_are_renewed_every_interval_while_held_and_never_after() -> None:
    renewals = Renewals()
    keeper = LeaseKeeper(renewals)
    batch = jobs(2)
    with keeper.holding(batch, 0.05, 60, None):
        time.sleep(0.4)
    during = len(renewals.calls)
    time.sleep(0.2)
    assert 3 <= during <= 9, renewals.calls  # about 0.4 / 0.05, on a busy machine fewer
    assert len(renewals.calls) == during, "a released batch is renewed no more"
    assert all(ids == [j.id for j in batch] for _, ids in renewals.calls)


def test_a_batch_shorter_than_its_interval_costs_no_renewal() -> None:
    renewals = Renewals()
    keeper = LeaseKeeper(renewals)
    for _ in range(20):
        with keeper.holding(jobs(1), 0.5, 60, None):
            pass
    time.sleep(0.6)
    assert renewals.calls == []


def test_one_thread_serves_every_batch_of_the_process() -> None:
    keeper = LeaseKeeper(Renewals())
    for _ in range(50):
        with keeper.holding(jobs(1), 0.5, 60, None):
            pass
    lease_threads = [t for t in threading.enumerate() if t.name == "lease-renewal"]
    assert len(lease_threads) >= 1
    mine = [t for t in lease_threads if t is keeper._thread._thread]
    assert len(mine) == 1 and mine[0].is_alive()


def test_a_batch_past_its_time_limit_is_handed_over_once() -> None:
    renewals = Renewals()
    keeper = LeaseKeeper(renewals)
    limited: list[list[uuid.UUID]] = []
    slow, quick = jobs(1), jobs(1)

    def on_limit(held: list[ClaimedJob]) -> None:
        limited.append([j.id for j in held])

    with keeper.holding(quick, 0.05, 60, on_limit), keeper.holding(slow, 0.05, 0.2, on_limit):
        time.sleep(0.6)
    assert limited == [[slow[0].id]], "called once, for the batch that outran its limit"
    renewed = {job_id for _, ids in renewals.calls for job_id in ids}
    assert quick[0].id in renewed


def test_a_batch_past_its_time_limit_is_renewed_no_more_while_still_held() -> None:
    """A holder that never ends its block after the limit (a decode loop gone, its
    job still held) must let the lease run out, for the sweep to take the job back:
    renewed on after the limit, the job would stay running with nothing running it."""
    renewals = Renewals()
    keeper = LeaseKeeper(renewals)
    batch = jobs(1)
    with keeper.holding(batch, 0.05, 0.2, lambda held: None):
        time.sleep(0.3)
        at_limit = len(renewals.calls)
        time.sleep(0.4)
    assert at_limit >= 1, "renewed before its limit"
    assert len(renewals.calls) == at_limit, renewals.calls


def test_a_failed_renewal_is_tried_again_the_next_interval() -> None:
    attempts: list[float] = []

    def failing(held: list[ClaimedJob]) -> set[uuid.UUID]:
        attempts.append(time.monotonic())
        raise ConnectionError("database away")

    keeper = LeaseKeeper(failing)
    with keeper.holding(jobs(1), 0.05, 60, None):
        time.sleep(0.4)
    assert 3 <= len(attempts) <= 9, attempts  # not a busy loop, and not given up


def test_a_job_a_renewal_finds_gone_to_another_attempt_is_handed_over_once() -> None:
    """The renewal's answer names the jobs still this worker's: one missing (taken
    back and claimed again elsewhere) goes to `on_lost` once and is renewed no more;
    its batch's other job goes on being renewed."""
    kept, taken = jobs(1)[0], jobs(1)[0]
    renewed: list[list[uuid.UUID]] = []
    lost: list[list[uuid.UUID]] = []

    def renew(held: list[ClaimedJob]) -> set[uuid.UUID]:
        renewed.append([j.id for j in held])
        return {kept.id}

    keeper = LeaseKeeper(renew)
    with keeper.holding([kept, taken], 0.05, 60, None, lambda j: lost.append([x.id for x in j])):
        time.sleep(0.4)
    assert lost == [[taken.id]]
    assert renewed[0] == [kept.id, taken.id]
    assert len(renewed) >= 3 and all(ids == [kept.id] for ids in renewed[1:]), renewed


def test_a_renewal_that_cannot_tell_loses_nothing() -> None:
    """A renewal that failed, or one whose renew cannot tell (None), hands nothing
    to `on_lost`: only a renewal that answered says a job is gone."""
    lost: list[ClaimedJob] = []
    answers = iter([None, ConnectionError("database away")] * 10)

    def renew(held: list[ClaimedJob]) -> set[uuid.UUID] | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    keeper = LeaseKeeper(renew)
    with keeper.holding(jobs(2), 0.05, 60, None, lost.extend):
        time.sleep(0.3)
    assert lost == []
