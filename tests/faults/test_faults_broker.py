"""Broker faults beyond a plain restart: Redis coming back empty in the middle of a
burst of submits, so that every wake-up message, queue and unacknowledged delivery
of that moment is gone while jobs keep being accepted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import requests

from tests.faults.harness import FaultStack
from tests.faults.scenarios import GUARD, check, digits, slow

pytestmark = [pytest.mark.faults, pytest.mark.processes]

BURST_S = 10.0
CLIENTS = 4
# A cheap job of a model the burst does not use (memhog at a harmless size).
LAST_OF_ITS_MODEL = {"model": "memhog", "inputs": {"n": [1000]}}


def burst(
    stack: FaultStack, seconds: float, during: Callable[[], None], at: float
) -> tuple[list[str], int]:
    """`CLIENTS` threads submit one job after another for `seconds`: digits, and until
    `during` has run (`at` seconds in) a slow job every fourth, so some are mid-run
    and more wait at the fault while none come after it. Returns the acknowledged ids
    and the number of submits tried."""
    ids: list[str] = []
    tried = [0]
    lock = threading.Lock()
    fault_done = threading.Event()
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {stack.api_key}"}

    def client(n: int) -> None:
        with requests.Session() as session:
            i = n
            while time.monotonic() < deadline:
                body = slow(0.05) if i % 4 == 0 and not fault_done.is_set() else digits(i)
                i += CLIENTS
                try:
                    r = session.post(f"{stack.base}/jobs", json=body, headers=headers, timeout=30)
                except requests.RequestException:
                    r = None
                with lock:
                    tried[0] += 1
                    if r is not None and r.status_code == 202:
                        ids.append(str(r.json()["id"]))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(at)
    during()
    fault_done.set()
    for thread in threads:
        thread.join()
    return ids, tried[0]


@GUARD
def test_19_redis_restarts_empty_during_a_burst_of_submits(
    make_stack: Callable[..., FaultStack], guarded: bool
) -> None:
    """Redis is killed 4 s into a 10 s burst and comes back with no data (a replaced
    node, a lost volume): the queued wake-ups and the messages the workers held are
    gone, and jobs were accepted while it was down. PostgreSQL holds every accepted
    job, and the sweep publishes again what waits too long. Jobs of a model whose
    traffic ends there (a third model, submitted only while Redis is down) are what
    the sweep alone can save: the burst's later submits wake their own model's
    waiting jobs, and a drain under way goes on claiming them."""
    stack = make_stack("" if guarded else "republish")
    stack.start_all(concurrency=2)
    restarted: list[float] = []
    while_down: list[str] = []

    def lose_redis() -> None:
        stack.kill_redis()
        while_down.extend(stack.submit([LAST_OF_ITS_MODEL] * 10, clients=2))
        stack.restart_redis(keep_data=False)
        restarted.append(time.monotonic())

    ids, tried = burst(stack, BURST_S, lose_redis, at=4.0)
    ids, tried = ids + while_down, tried + 10
    done = stack.wait_terminal(ids, 90 if guarded else 20, settle=not guarded)
    tally = stack.tally(
        "19. Redis restarted empty during a 10 s burst of submits",
        "on" if guarded else "off: republish",
        ids,
        tried,
    )
    tally.recovery_s = None if done is None else round(time.monotonic() - restarted[0], 1)
    refused = tried - len(ids)
    tally.notes.append(
        f"{CLIENTS} clients, {refused} submits not acknowledged; "
        f"{len(while_down)} jobs of a third model accepted while Redis was down"
    )
    check(tally, guarded, lambda t: t.lost > 0)
    assert len(ids) > 100 and len(while_down) == 10, tally  # a burst; accepted while down
