"""Probes the self-check runs inside hosts: `python -m tests.fleet.probes KIND ARGS...`.

Each is a process of its host (what matters is what a process there sees) and prints
its findings as JSON lines to its log. Outcomes say "ok", "timeout" or the error, with
the seconds taken: a partition must show as a timeout, never as a reset.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg2
import redis
import redis.asyncio as aioredis


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def outcome(action: Callable[[], object]) -> dict[str, object]:
    start = time.monotonic()
    try:
        action()
        result = "ok"
    except (redis.TimeoutError, TimeoutError):
        result = "timeout"
    except Exception as exc:
        result = f"error {type(exc).__name__}: {exc}"
    return {"result": result, "seconds": round(time.monotonic() - start, 3)}


def new_ping(url: str) -> Callable[[], object]:
    """A PING on a new connection, 2 s to connect and 2 s to answer."""
    return lambda: redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2).ping()


def median_ms(call: Callable[[], object], count: int) -> float:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def rtt(database_url: str, redis_url: str, count: str) -> None:
    """Median round trip of `SELECT 1` and of PING, each on one connection."""
    with psycopg2.connect(database_url) as conn, conn.cursor() as cursor:
        pg_ms = median_ms(lambda: cursor.execute("SELECT 1") or cursor.fetchone(), int(count))
    client = redis.Redis.from_url(redis_url)
    client.ping()
    say(pg_ms=round(pg_ms, 3), redis_ms=round(median_ms(client.ping, int(count)), 3))


def busy(seconds: str) -> None:
    say(started=True)
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        pass


def counter(path: str) -> None:
    """A count written every 10 ms: it stops while the host is frozen."""
    for count in range(10**9):
        Path(path).write_text(str(count))
        time.sleep(0.01)


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def hold(redis_url: str, flags: str) -> None:
    """A connection across a cut (flag file `cut`) and a heal (flag file `healed`)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    say(before=outcome(client.ping))
    _wait_for(Path(flags) / "cut")
    say(existing=outcome(client.ping), new=outcome(new_ping(redis_url)))
    _wait_for(Path(flags) / "healed")
    say(healed=outcome(new_ping(redis_url)))


def ping(redis_url: str) -> None:
    say(**outcome(new_ping(redis_url)))


def listen(port: str) -> None:
    server = socket.create_server(("0.0.0.0", int(port)))
    while True:
        server.accept()[0].close()


def connect(address: str, port: str) -> None:
    say(**outcome(lambda: socket.create_connection((address, int(port)), timeout=2).close()))


def load(redis_url: str, connections: str, pings: str) -> None:
    """`pings` PINGs in all, on `connections` connections at once."""

    async def one() -> None:
        client = aioredis.Redis.from_url(redis_url)
        for _ in range(int(pings) // int(connections)):
            await client.ping()
        await client.aclose()

    async def all_of() -> None:
        await asyncio.gather(*(one() for _ in range(int(connections))))

    start = time.monotonic()
    asyncio.run(all_of())
    say(seconds=round(time.monotonic() - start, 3))


PROBES: dict[str, Callable[..., None]] = {
    f.__name__: f for f in (rtt, busy, counter, hold, ping, listen, connect, load)
}

if __name__ == "__main__":
    PROBES[sys.argv[1]](*sys.argv[2:])
