"""(j) the stream door: one-row digits requests appended to a binding's input log by
a producer, timed to the last result in its output log.

The producer is the bench process: it appends N entries with pipelined XADDs
(bodies encoded before the clock starts), then reads the output log with
blocking XREADs until N results are there. jobs/s = N / (the last result's own
time in the log, from its entry id, - the first append); the reading's pace does
not blur it. CPU per job is summed over every role, as for the HTTP workloads,
with the bench's own (producer and reader) apart as the client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis

from bench.contenders.base import HttpContender
from bench.cpu import per_job_ms
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
