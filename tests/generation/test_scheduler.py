"""The decode loop's policy on a clock of the test's own: no database, Redis or
model. When it claims, shares, looks for cancellations, counts and stops; which
generations it pauses and resumes."""

from __future__ import annotations

from collections.abc import Callable

from app.engine.scheduler import (
    BACKLOG_EVERY_S,
    CANCELS_EVERY_S,
    CLAIM_EVERY_S,
    COUNT_EVERY_S,
    LOCK_RENEW_S,
    SHARE_EVERY_S,
    VERSIONS_EVERY_S,
    Scheduler,
)
from app.generation.sharing import Waiter


def no_wake_up() -> bool:
    return False


def wake_up() -> bool:
    return True


def test_a_fresh_loop_claims_at_once_then_on_the_timer_or_a_wake_up() -> None:
    s = Scheduler(slots=4, started=100.0, drain_s=60, linger_s=10)
    turn = s.turn(100.0, free=4, pending=no_wake_up)
    assert turn.renew_lock and turn.claim == 4 and not turn.share
    s.claimed(100.0, more=False)
    assert s.turn(100.1, 4, no_wake_up).claim == 0, "the next claim waits for its timer"
    assert s.turn(100.1, 4, wake_up).claim == 4, "a wake-up makes it due at once"
    assert s.turn(100.0 + CLAIM_EVERY_S, 4, no_wake_up).claim == 4
    s.claimed(101.0, more=True)  # the queue held more than the slots took
    assert s.turn(101.0, 2, no_wake_up).claim == 2


def test_the_lock_is_renewed_a_fifth_of_its_life_apart() -> None:
    s = Scheduler(slots=1, started=0.0, drain_s=60, linger_s=10)
    renewals = [t / 10 for t in range(100) if s.turn(t / 10, 0, no_wake_up).renew_lock]
    assert renewals == [0.0, LOCK_RENEW_S, 2 * LOCK_RENEW_S, 3 * LOCK_RENEW_S, 4 * LOCK_RENEW_S]


def test_an_idle_loop_lingers_then_stops_and_a_busy_one_steps() -> None:
    s = Scheduler(slots=2, started=0.0, drain_s=60, linger_s=10)
    then = s.then(1.0)
    assert then.idle and not then.stop and not then.step
    assert s.then(10.0).stop, "idle past its linger"
    s = Scheduler(slots=2, started=0.0, drain_s=60, linger_s=10)
    s.admitted("a", 1, 0, 0.0)
    then = s.then(5.0)
    assert then.step and then.cancels and then.count
    again = s.then(5.0 + min(CANCELS_EVERY_S, COUNT_EVERY_S) / 2)
    assert again.step and not again.cancels and not again.count
    s.left("a")
    assert not s.then(14.0).stop, "the linger runs from the last busy pass"
    assert s.then(15.2).stop
    s = Scheduler(slots=2, started=0.0, drain_s=60, linger_s=0)
    assert s.then(0.0).stop, "no linger: it stops at the first pass with nothing running"


def test_past_its_drain_time_an_idle_loop_lingers_until_other_work_waits() -> None:
    """The next call finds the loop running, its model loaded and its prefixes
    kept, unless its worker's process is wanted for other work."""
    asked: list[float] = []

    def backlog_at(t: float) -> Callable[[], bool]:
        def backlog() -> bool:
            asked.append(t)
            return t >= 3.0

        return backlog

    s = Scheduler(slots=2, started=0.0, drain_s=1, linger_s=10)
    s.admitted("a", 1, 0, 0.0)
    s.left("a")
    assert not s.then(0.5, backlog_at(0.5)).stop and not asked, "asked before the drain time"
    for t in (1.0, 1.1, 2.0):
        assert not s.then(t, backlog_at(t)).stop, "stopped with no other work waiting"
        assert s.turn(t, 2, wake_up).claim == 2, "a lingering loop takes its model's calls"
    assert asked == [1.0, 2.0], "the backlog is looked at on its timer, not every pass"
    assert not s.then(2.0 + BACKLOG_EVERY_S / 2, backlog_at(3.0)).stop
    assert s.then(2.0 + BACKLOG_EVERY_S, backlog_at(3.0)).stop, "other work waits"
    s = Scheduler(slots=2, started=0.0, drain_s=1, linger_s=10)
    assert s.then(10.0, no_wake_up).stop, "idle past its linger"
    s = Scheduler(slots=2, started=0.0, drain_s=30, linger_s=10)
    s.admitted("a", 1, 0, 0.0)
    assert s.turn(31.0, 1, wake_up).claim == 1, "a running loop keeps taking jobs"
    assert s.then(31.0, wake_up).step, "a busy loop never asks"


def test_every_slot_taken_it_shares_on_its_own_timer() -> None:
    s = Scheduler(slots=2, started=0.0, drain_s=60, linger_s=10)
    s.admitted("a1", 1, 0, 0.0)
    s.admitted("a2", 1, 0, 0.5)
    turn = s.turn(1.0, 0, wake_up)
    assert turn.share and turn.claim == 0
    assert not s.turn(1.0 + SHARE_EVERY_S / 2, 0, wake_up).share
    assert s.turn(1.0 + SHARE_EVERY_S, 0, wake_up).share
    pairs = s.preempt([Waiter("b1", 2, 0)])
    assert [(h.key, w.key) for h, w in pairs] == [("a2", "b1")], "the youngest of tenant 1"
    s.pause("a2")
    s.admitted("b1", 2, 0, 2.0)
    assert s.preempt([Waiter("b2", 2, 0)]) == [], "one slot each: fair"


def test_paused_generations_go_on_first_paused_first_before_new_claims() -> None:
    s = Scheduler(slots=3, started=0.0, drain_s=60, linger_s=10)
    for key, when in (("a1", 0.0), ("a2", 1.0), ("a3", 2.0)):
        s.admitted(key, 1, 0, when)
    s.pause("a3")
    s.pause("a1")
    turn = s.turn(5.0, free=2, pending=wake_up)
    assert turn.resume == 2 and turn.claim == 0, "freed slots go to paused ones first"
    assert s.resumable(turn.resume, 5.0) == ["a3", "a1"] and not s.paused
    assert s.holders["a1"].joined == 5.0, "it joins again: it is now the youngest"
    s.pause("a2")
    turn = s.turn(6.0, free=3, pending=wake_up)
    assert (turn.resume, turn.claim) == (1, 2)
    s.left("a2")  # ended while paused (cancelled): it does not go on
    assert s.resumable(1, 6.0) == [] and "a2" not in s.holders


def test_it_looks_for_other_versions_on_a_timer_and_after_an_empty_claim() -> None:
    s = Scheduler(slots=2, started=0.0, drain_s=60, linger_s=10)
    assert not s.turn(0.0, 2, no_wake_up).look, "it starts on the version first in line"
    s.claimed(0.0, more=False, took=1)
    looks = [t / 10 for t in range(1, 35) if s.turn(t / 10, 0, no_wake_up).look]
    assert looks == [VERSIONS_EVERY_S, 2 * VERSIONS_EVERY_S, 3 * VERSIONS_EVERY_S]
    s.claimed(3.45, more=False, took=0)  # a wake-up, but none of its version's jobs
    assert s.turn(3.5, 2, no_wake_up).look


def test_closed_for_another_version_it_finishes_what_it_runs_then_stops() -> None:
    s = Scheduler(slots=4, started=0.0, drain_s=60, linger_s=10)
    s.admitted("a", 1, 0, 0.0)
    s.admitted("b", 2, 0, 0.0)
    s.pause("b")
    s.close()
    turn = s.turn(1.0, 2, wake_up)
    assert turn.claim == 0 and not turn.share and not turn.look, "it takes no more"
    assert turn.resume == 1, "a paused generation still goes on"
    assert s.then(1.0).step
    s.left("a")
    assert s.then(1.1).step, "b still runs"
    s.left("b")
    assert s.then(1.2).stop, "empty, it stops at once, whatever its linger"
