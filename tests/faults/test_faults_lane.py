"""Fault scenario 24: the sync lane's records, written behind their answers, through
workers killed at staged points.

Eight clients make one-row sync calls of digits (HTTP, KServe v2) while a worker
child SIGKILLs itself (tests.faults.lane_crash) right after answering calls and
journaling their records, before writing them to PostgreSQL (three times), and
right after taking calls, before running them (twice). A second worker serves
the same lane. Every call answered 200 must have its record (the job its answer
names, succeeded, with its outputs) once the writers had time; no record may
belong to a call that was not answered.

The guard switched off is `journal`: the answer and the journaled record are one
Redis step. Without it a record lives only in the dying worker's memory, and the
calls it had answered have none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import requests
import sqlalchemy as sa

from tests.faults.harness import LANE_CRASH_VARIABLE, FaultStack, Tally, settled
from tests.faults.scenarios import GUARD, ROWS, check

pytestmark = [pytest.mark.faults, pytest.mark.processes]

CLIENTS = 8
POINTS = ("answered", "taken", "answered", "taken", "answered")
RECORD_WAIT_S = 30.0  # the bound: the journal's grace (5 s) and a writer's round, many times


class Callers:
    """Clients making sync calls until stopped: per call, its id and whether it was
    answered (200) or not (an error, a 503 for a call its worker lost)."""

    def __init__(self, stack: FaultStack) -> None:
        self._stack, self._stop = stack, threading.Event()
        self.answered: list[str] = []
        self.unanswered: list[str] = []  # the ids a refusal or timeout named
        self.failures = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._call, args=(i,)) for i in range(CLIENTS)]

    def start(self) -> Callers:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _call(self, client: int) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {self._stack.api_key}"}
        url = f"{self._stack.base}/v2/models/digits/infer"
        i = client
        while not self._stop.is_set():
            row = np.asarray(ROWS[i % len(ROWS)], np.float32).tolist()
            body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                "data": row}]}  # fmt: skip
            i += CLIENTS
            try:
                r = session.post(url, json=body, headers=headers, timeout=30)
            except requests.RequestException:
                with self._lock:
                    self.failures += 1
                continue
            with self._lock:
                if r.status_code == 200:
                    self.answered.append(r.json()["parameters"]["job_id"])
                else:
                    self.failures += 1
                    if job_id := (r.json() or {}).get("job_id"):
                        self.unanswered.append(job_id)


def records(stack: FaultStack) -> dict[str, str]:
    with stack.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id::text, status FROM jobs WHERE model = 'digits'"))
        return {row[0]: row[1] for row in rows}


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@GUARD
def test_24_sigkill_the_sync_lane_after_answering(
    make_stack: Callable[..., FaultStack], guarded: bool
) -> None:
    stack = make_stack("" if guarded else "journal")
    crash = stack.root / "lane-crash"
    stack.start_api()
    stack.start_worker("worker0", concurrency=1, **{LANE_CRASH_VARIABLE: str(crash)})
    stack.start_worker("worker1", concurrency=1)
    callers = Callers(stack).start()
    fired: list[str] = []
    try:
        wait_for(lambda: len(callers.answered) >= 50, 60, "the first answers")
        for point in POINTS:
            crash.write_text(point)
            wait_for(lambda: not crash.exists(), 60, f"the crash at {point}")
            fired.append(point)
            more = len(callers.answered) + 50
            wait_for(lambda n=more: len(callers.answered) >= n, 60, "answers after the crash")
    finally:
        callers.stop()
    answered, unanswered = set(callers.answered), set(callers.unanswered)
    started = time.monotonic()

    def all_recorded() -> bool:
        return answered <= records(stack).keys()

    # Guard off, the records that will come are in once none came for SETTLE_S.
    settled(lambda: len(records(stack)), lambda _: all_recorded(), RECORD_WAIT_S, not guarded)
    written = records(stack)
    without = answered - written.keys()
    strays = written.keys() - answered  # records of calls nobody was answered
    tally = Tally("24. SIGKILL the sync lane after answering", "on" if guarded else "off: journal",
                  jobs=len(answered) + callers.failures, acknowledged=len(answered),
                  completed=sum(written.get(i) == "succeeded" for i in answered),
                  lost=len(without))  # fmt: skip
    tally.recovery_s = round(time.monotonic() - started, 1) if not without else None
    tally.notes.append(
        f"sync calls answered: {len(answered)}, not answered: {callers.failures} (503 for a "
        f"lost call, or cut off); answered calls without a record: {len(without)}; records of "
        f"calls not answered: {len(strays)}; killed {len(fired)} times ({', '.join(fired)})"
    )
    check(tally, guarded, lambda t: t.lost > 0)
    if guarded:
        assert not strays and not (unanswered & written.keys()), strays
        assert fired == list(POINTS)
