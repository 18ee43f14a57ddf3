"""(j) the stream door: one-row digits requests appended to a binding's input log by
a producer, timed to the last result in its output log (and the soak's paced
producer, `paced_entries`).

The producer is the bench process: it appends N entries with pipelined XADDs
(bodies encoded before the clock starts), then reads the output log with
blocking XREADs until N results are there. jobs/s = N / (the last result's own
time in the log, from its entry id, - the first append); the reading's pace does
not blur it. CPU per job is summed over every role, as for the HTTP workloads,
with the bench's own (producer and reader) apart as the client.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from bench.contenders.base import HttpContender, StreamDoor
from bench.cpu import per_job_ms
from bench.load import LoadResult, Schedule, sleep_until
from bench.stats import rounded

PIPELINE = 1000  # entries per round trip of the producer
READ = 1000  # entries per XREAD of the reader


def entry_fields(rows: Sequence[Sequence[float]], count: int) -> list[tuple[bytes, bytes]]:
    """(id, inputs) of `count` one-row requests, rows cycling, encoded once."""
    bodies = [json.dumps({"pixels": [list(map(float, row))]}).encode() for row in rows]
    return [(f"s{i}".encode(), bodies[i % len(bodies)]) for i in range(count)]


def stream_jobs(
    c: HttpContender, entries: list[tuple[bytes, bytes]], timeout: float
) -> dict[str, Any] | None:
    """Append every entry, then read until each has its result; None for a
    contender without a stream door."""
    door = c.stream
    if door is None:
        return None
    client = redis.Redis.from_url(door.redis_url, socket_timeout=30)
    last_seen = _last_id(client, door.output)
    cpu0 = c.meter.sample()
    first = time.time()
    for start in range(0, len(entries), PIPELINE):
        pipe = client.pipeline(transaction=False)
        for request_id, inputs in entries[start : start + PIPELINE]:
            pipe.execute_command("XADD", door.input, "*", "id", request_id, "inputs", inputs)
        pipe.execute()
    appended = time.time()
    got, failed, last_ms = 0, 0, 0
    deadline = time.monotonic() + timeout
    while got < len(entries) and time.monotonic() < deadline:
        reply: Any = client.xread({door.output: last_seen}, count=READ, block=1000)
        for _, rows in reply or []:
            for entry_id, fields in rows:
                last_seen = entry_id
                got += 1
                failed += fields.get(b"status") != b"succeeded"
                last_ms = int(entry_id.split(b"-")[0])
    cpu1 = c.meter.sample()
    span = last_ms / 1000 - first if got else None
    return {
        "workload": "j",
        "variant": f"{len(entries)} one-row entries, pipelined XADD",
        "jobs": got,
        "jobs_per_s": rounded(got / span if span and span > 0 else None),
        "seconds": rounded(span, 2),
        "append_s": rounded(appended - first, 3),
        "failed": failed,
        "lost": len(entries) - got,
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, got),
    }


def _last_id(client: redis.Redis, log: str) -> bytes:
    """Where reading starts: after what the log already holds (an earlier repeat's)."""
    last: Any = client.xrevrange(log, count=1)
    return bytes(last[0][0]) if last else b"0-0"


def paced_entries(
    door: StreamDoor, inputs: Sequence[bytes], schedule: Schedule, timeout: float
) -> LoadResult:
    """The soak's stream door, open loop: one XADD at each time of `schedule`
    (request ids `n0`, `n1`, ...) while a second thread reads the output log; each
    latency runs from the scheduled time to the result's own time in the log (its
    entry id), so neither thread's pace blurs it. After the last append the reader
    waits up to `timeout` for the rest; what never came back is `sent - accepted -
    errors`."""
    client = redis.Redis.from_url(door.redis_url, socket_timeout=30)
    start_id = _last_id(client, door.output)
    produced, read = LoadResult(), LoadResult()
    done = threading.Event()
    # perf_counter time -> epoch milliseconds, for the log's own clock
    epoch_ms = (time.time() - time.perf_counter()) * 1000

    def reader() -> None:
        last_seen, deadline = start_id, float("inf")
        while read.accepted + read.errors < produced.sent - produced.errors or not done.is_set():
            if done.is_set() and deadline == float("inf"):
                deadline = time.monotonic() + timeout
            if time.monotonic() > deadline:
                return
            reply: Any = client.xread({door.output: last_seen}, count=READ, block=500)
            for _, rows in reply or []:
                for entry_id, fields in rows:
                    last_seen = entry_id
                    i = _index(fields.get(b"id", b""))
                    if i is None or i >= len(schedule.offsets):
                        continue  # not one of these requests
                    started = schedule.start + schedule.offsets[i]
                    if fields.get(b"status") != b"succeeded":
                        read.failed(started, f"status {fields.get(b'status')!r}")
                        continue
                    read.accepted += 1
                    at_ms = int(entry_id.split(b"-")[0])
                    read.answered(started, max(0.0, at_ms - (started * 1000 + epoch_ms)))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    take = schedule.slots()
    produced.first_send = time.time()
    while (slot := take()) is not None:
        i, at = slot
        sleep_until(at)
        produced.sent += 1
        try:
            client.xadd(door.input, {"id": f"n{i}", "inputs": inputs[i % len(inputs)]})
        except redis.RedisError as exc:
            produced.failed(at, f"XADD: {exc}")  # never appended: nothing to wait for
    done.set()
    thread.join()
    produced.merge(read)
    produced.last_answer = time.time()
    return produced


def _index(request_id: bytes) -> int | None:
    """n17 -> 17; None for an id the soak did not send."""
    if not request_id.startswith(b"n") or not request_id[1:].isdigit():
        return None
    return int(request_id[1:])
