"""Fault scenarios of memory: a worker child the kernel's OOM killer ends.

The worker runs in a memory cgroup of its own (tests.faults.memory) with a hard
limit, so a row that makes ONNX Runtime write more than that gets its worker
child killed by the kernel, as on a machine that ran out of memory; nothing in
the service is told why its child went away.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from app.cli.launcher import worker_command
from tests.conftest import QUIET_WORKER
from tests.faults.harness import FaultStack, Service
from tests.faults.memory import MemoryCgroup, Unavailable
from tests.faults.scenarios import check, digits
from tests.models import build_memhog_rows

pytestmark = [pytest.mark.faults, pytest.mark.processes]

# The worker may grow by HEADROOM over what it holds once up (a child the pool
# starts again loads what the killed one held); the poison row writes 1 GiB.
HEADROOM = 384 * 1024 * 1024
POISON_N = 1 << 28
CHUNK_ROWS = 8


@pytest.fixture
def memory_cgroup() -> Iterator[Callable[[], MemoryCgroup]]:
    """`memory_cgroup()`: a memory cgroup removed after the test (its processes
    moved back out first); the test is skipped where none can be made."""
    made: list[MemoryCgroup] = []

    def make() -> MemoryCgroup:
        try:
            group = MemoryCgroup.make(f"faults-{uuid.uuid4().hex[:8]}")
        except Unavailable as exc:
            pytest.skip(f"needs a memory cgroup this process can create and limit: {exc}")
        made.append(group)
        return group

    yield make
    for group in made:
        group.close()


def start_limited_worker(
    stack: FaultStack, group: MemoryCgroup, name: str = "worker", concurrency: int = 2
) -> Service:
    """A worker started in `group` (its pool's children with it), limited to what
    it holds once ready plus HEADROOM."""
    hostname = f"{name}-{uuid.uuid4().hex[:6]}@%h"
    args = worker_command("inference", concurrency, hostname, *QUIET_WORKER,
                          app=stack.entry_point)  # fmt: skip
    service = Service(name, group.wrap(args), stack.env, stack.root).start()
    service.wait_for_log(b" ready.")
    stack.services[name] = service
    deadline = time.monotonic() + 30
    while len(service.children()) < concurrency and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the children load their models after the fork
    assert service.proc is not None and service.proc.pid in group.pids()
    group.limit(group.usage() + HEADROOM)
    return service


def submit_batch(stack: FaultStack, model: str, rows: list[int]) -> str:
    """Upload `rows` as a .jsonl file (a worker cuts it into chunks) and start its batch."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    text = "".join(json.dumps({"n": [n]}) + "\n" for n in rows)
    upload = requests.post(f"{stack.base}/files", params={"filename": "rows.jsonl"},
                           data=text.encode(), headers=headers, timeout=30)  # fmt: skip
    assert upload.status_code == 201, upload.text
    batch = requests.post(f"{stack.base}/batches", headers=headers, timeout=30,
                          json={"model": model, "file_id": upload.json()["id"]})  # fmt: skip
    assert batch.status_code == 202, batch.text
    return str(batch.json()["id"])


def get_batch(stack: FaultStack, batch_id: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    response = requests.get(f"{stack.base}/batches/{batch_id}", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    batch: dict[str, Any] = response.json()
    return batch


def wait_batches(stack: FaultStack, batch_ids: list[str], timeout: float) -> float | None:
    """Seconds until every batch ended (its split done, each chunk terminal), or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if all(get_batch(stack, b)["status"] not in ("queued", "running") for b in batch_ids):
            return time.monotonic() - start
        time.sleep(0.2)
    return None


def chunks_of(stack: FaultStack, batch_ids: list[str]) -> list[Any]:
    with stack.engine.connect() as conn:
        return list(conn.execute(
            sa.text("SELECT id::text, batch_id::text, batch_index, status, attempts, error_code "
                    "FROM jobs WHERE batch_id::text = ANY(:ids) ORDER BY batch_id, batch_index"),
            {"ids": batch_ids},
        ))  # fmt: skip


@pytest.mark.parametrize("guarded", [True, False], ids=["guard on", "guard off"])
def test_12_a_worker_child_oom_killed_mid_batch_chunk(
    make_stack: Callable[..., FaultStack],
    memory_cgroup: Callable[[], MemoryCgroup],
    model_repository: Path,
    guarded: bool,
) -> None:
    """Two .jsonl batches of 256 rows (32 chunks of 8 rows each, 4 chunks to a
    call) and 100 digits jobs on one worker whose processes may grow by
    HEADROOM in all. One row of the first batch makes ONNX Runtime write 1 GiB:
    each attempt at its chunk gets the worker child running it OOM-killed,
    with the chunks claimed beside it the first time. The lease sweep takes
    them back after each kill; a chunk back from a dead worker is claimed
    alone, so the others succeed on their next attempt, and the poison chunk,
    after its last attempt, fails with a dead letter; the pool replaces each
    killed child, and every other chunk and job succeeds. Without the lease
    the chunks of the first kill are never taken back: they and their batches
    never end."""
    build_memhog_rows(model_repository, CHUNK_ROWS, 4 * CHUNK_ROWS)
    stack = make_stack("" if guarded else "lease")
    stack.start_api()
    group = memory_cgroup()
    start_limited_worker(stack, group, "worker0", concurrency=2)
    limit_mib = group.limit_bytes() >> 20
    stack.start_beat()
    poison_row = 3 * CHUNK_ROWS + 5  # in chunk 3
    poisoned = [i % 50 + 1 for i in range(256)]
    poisoned[poison_row] = POISON_N
    batch_ids = [
        submit_batch(stack, "memhog-rows", poisoned),
        submit_batch(stack, "memhog-rows", [i % 70 + 1 for i in range(256)]),
    ]
    job_ids = stack.submit([digits(i) for i in range(100)])
    done = wait_batches(stack, batch_ids, timeout=40 if guarded else 20)
    jobs_done = stack.wait_terminal(job_ids, timeout=30)
    chunks = chunks_of(stack, batch_ids)
    poison = [c for c in chunks if c.batch_id == batch_ids[0] and c.batch_index == 3]
    assert len(chunks) == 64 and len(poison) == 1, chunks
    # The replaced children still serve: jobs submitted after the kills run.
    later = stack.submit([digits(i) for i in range(10)])
    later_done = stack.wait_terminal(later, timeout=30)
    kills = group.oom_kills()
    ids = [c.id for c in chunks] + job_ids + later
    tally = stack.tally(
        "12. A worker child OOM-killed mid batch chunk",
        "on" if guarded else "off: lease",
        ids,
        64 + 110,
    )
    with stack.engine.connect() as conn:
        letters = conn.execute(sa.text("SELECT job_id::text, error_code FROM dead_letters")).all()
    statuses = stack.statuses(ids)
    expected = {i: "succeeded" for i in ids} | {poison[0].id: "failed"}
    tally.completed = sum(statuses.get(i) == want for i, want in expected.items())
    tally.recovery_s = done and round(done, 1)
    states = [get_batch(stack, b)["status"] for b in batch_ids]
    beside = sum(c.status == "succeeded" and c.attempts > 1 for c in chunks)
    tally.notes.append(
        f"{kills} OOM kills (worker limited to {limit_mib} MiB); poison chunk "
        f"{poison[0].status} after {poison[0].attempts} attempts, {len(letters)} dead "
        f"letters; {beside} chunks retried and succeeded; batches {', '.join(states)}"
    )
    check(tally, guarded, lambda t: t.lost > 0)
    if guarded:
        assert done is not None and jobs_done is not None and later_done is not None, tally
        assert states == ["partially_succeeded", "succeeded"], states
        assert [(c.id, c.attempts) for c in chunks if c.status != "succeeded"] == [
            (poison[0].id, 3)
        ]
        assert letters == [(poison[0].id, "attempts_exhausted")], letters
        # One kill an attempt at the poison chunk; the kernel may take the other
        # child with it (both grew within the limit), whose chunks are retried.
        assert 3 <= kills <= 6 and tally.duplicate_executions == 0, tally
        first = get_batch(stack, batch_ids[0])
        assert first["failed_rows"] == [{"first": 24, "last": 31, "status": "failed",
                                         "error": "attempts_exhausted"}], first  # fmt: skip
    else:
        assert kills >= 1 and poison[0].status == "running" and states[0] == "running", tally
