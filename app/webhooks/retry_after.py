"""Reading a receiver's Retry-After: never trusted beyond the retry schedule.

A receiver controls this header, so it must neither park a delivery for ages
(`250000000000`), nor crash the attempt (a number too large for a float, or a
digit Python's `int` accepts but HTTP does not, such as `²`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def seconds(header: str | None, ceiling: float, now: datetime | None = None) -> float | None:
    """Seconds to wait, between 0 and `ceiling`; None when absent or unreadable.

    HTTP allows delta-seconds (ASCII digits) or an HTTP date."""
    if not header:
        return None
    value = header.strip()
    if value.isascii() and value.isdigit():
        # More digits than any sane wait: the ceiling (and no huge int to convert).
        return ceiling if len(value) > 12 else min(float(int(value)), ceiling)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, min(delta, ceiling))
