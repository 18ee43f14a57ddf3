"""The soak's figures over time, and its bounds: latency per window, memory per
process at start and end, when to kill.

A soak fails slowly: a leak, a queue that never quite drains, a pool that
degrades after each crash. One figure for the whole run hides that; the first
window against the last shows it. Kept free of processes and clocks so the
arithmetic is tested on its own (tests/bench/test_windows.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.stats import percentile, rounded

# "Memory flat": no process of the service (after warm-up) grows by RSS_GROWTH_MB or
# more. At half load here (~100-200 requests/s) 20 minutes is 120,000-240,000
# requests, so a leak of ~100-170 bytes a request in any one process crosses it,
# while allocator and cache noise after warm-up stays within a few MB.
RSS_GROWTH_MB = 20.0
# "p99 stable": the last window's p99 at most P99_FACTOR times the first's. A p99
# under P99_FLOOR_MS counts as the floor: at a few ms one neighbour's burst on a
# shared 2-core machine moves a window's p99 by more than 2x without the service
# having changed.
P99_FACTOR = 2.0
P99_FLOOR_MS = 5.0


def window_count(seconds: float, window_s: float) -> int:
    """Windows of `window_s` covering `seconds` (the last may be shorter)."""
    return max(1, math.ceil(seconds / window_s - 1e-9))


def kill_times(seconds: float, every_s: float) -> list[float]:
    """When to kill, in seconds from the start: one in the middle of each interval
    (every_s / 2, 3 every_s / 2, ...), so every window of `every_s` holds exactly
    one kill and the first window is no calmer than the last."""
    times, t = [], every_s / 2
    while t < seconds:
        times.append(t)
        t += every_s
    return times


def windows(
    sent_at: Sequence[float],
    latencies_ms: Sequence[float],
    unanswered_at: Sequence[float],
    start: float,
    window_s: float,
    count: int,
) -> list[dict[str, Any]]:
    """Per window of `window_s` from `start`, by when each request was sent (or a
    job created): answered requests, their p50 / p99 / max latency, and requests
    not answered 2xx. A time just outside the run (a job recorded a moment after
    its request was sent at the very end) counts in the nearest window."""
    answered: list[list[float]] = [[] for _ in range(count)]
    unanswered = [0] * count

    def slot(at: float) -> int:
        return min(count - 1, max(0, int((at - start) // window_s)))

    for at, ms in zip(sent_at, latencies_ms, strict=True):
        answered[slot(at)].append(ms)
    for at in unanswered_at:
        unanswered[slot(at)] += 1
    return [
        {
            "from_s": rounded(i * window_s, 1),
            "answered": len(lat),
            "p50": rounded(percentile(lat, 0.50), 2),
            "p99": rounded(percentile(lat, 0.99), 2),
            "max": rounded(max(lat) if lat else None, 2),
            "unanswered": unanswered[i],
        }
        for i, lat in enumerate(answered)
    ]


def p99_drift(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The last window's p99 over the first's, the first counted as at least
    P99_FLOOR_MS; None without two windows, or with either of them empty."""
    if len(rows) < 2 or rows[0]["p99"] is None or rows[-1]["p99"] is None:
        return None
    return round(float(rows[-1]["p99"]) / max(float(rows[0]["p99"]), P99_FLOOR_MS), 2)


def worst_drift(drifts: Mapping[str, float | None]) -> float | None:
    """The largest drift of any door; None when no door has one."""
    present = [d for d in drifts.values() if d is not None]
    return max(present) if present else None


def rss_rows(start: Mapping[str, float], end: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per process: MB at start and end and the growth; a process found
    at one end only (killed, or started since) has no growth."""
    rows = []
    for name in sorted(set(start) | set(end)):
        first, last = start.get(name), end.get(name)
        growth = last - first if first is not None and last is not None else None
        rows.append({"process": name, "start_mb": rounded(first), "end_mb": rounded(last),
                     "growth_mb": rounded(growth)})  # fmt: skip
    return rows


def largest_growth(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The largest growth of any process found at both ends (may be negative)."""
    grown = [r["growth_mb"] for r in rows if r["growth_mb"] is not None]
    return max(grown) if grown else None


def lost(async_not_final: int, stream_unanswered: int, not_final: int) -> int:
    """Accepted work that never reached an end: accepted async jobs not final,
    stream entries with no result, and every job of the run not final (a job can
    count in two of these; the sum is 0 only when nothing was lost)."""
    return async_not_final + stream_unanswered + not_final
