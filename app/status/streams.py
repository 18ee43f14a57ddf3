"""How far behind each stream binding is: for the status page and /metrics.

Per binding: the consumer group's lag (entries appended and not yet read: what
backpressure lets grow), the age of the oldest of them, the entries read and not
yet acknowledged, and the accepted entries whose result is not yet in the output
log. The bindings and unpublished counts come from PostgreSQL (a partial index
holds only unpublished entries), the rest from the logs' engine in one pipelined
round trip; both at read time, so they are right wherever the consumers run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, Row, text
from sqlalchemy.orm import Session

from app.observability.metrics import read_at_scrape
from app.platform.logstreams import GroupState, LogEngine

logger = logging.getLogger(__name__)

MAX_LINES = 500
_BINDINGS = text(
    """
    SELECT b.id, t.name AS tenant, b.model, b.input, b.output, b.dead_letter, b.paused,
           (SELECT count(*) FROM stream_entries e
            WHERE e.binding_id = b.id AND e.published_at IS NULL) AS unpublished
    FROM stream_bindings b JOIN tenants t ON t.id = b.tenant_id
    ORDER BY t.name, b.input LIMIT :limit
    """
)


@dataclass(frozen=True)
class StreamLine:
    """One binding; `state` None when its log has no group yet or the logs' Redis
    did not answer (`reachable`)."""

    binding_id: uuid.UUID
    tenant: str
    model: str
    input: str
    output: str
    dead_letter: str
    paused: bool
    unpublished: int
    state: GroupState | None
    reachable: bool = True


@dataclass(frozen=True)
class StreamTotals:
    """Every binding together: what anyone may see (the lines name tenants)."""

    bindings: int = 0
    lag: int = 0
    lag_capped: bool = False  # some lag only counted up to its cap (Redis 6.2)
    behind_s: float = 0.0  # the oldest unread entry of any binding
    pending: int = 0
    unpublished: int = 0

    @classmethod
    def of(cls, lines: Sequence[StreamLine]) -> StreamTotals:
        states = [line.state for line in lines if line.state is not None]
        return cls(
            bindings=len(lines),
            lag=sum(s.lag or 0 for s in states),
            lag_capped=any(s.lag_capped for s in states),
            behind_s=max((s.behind_s for s in states), default=0.0),
            pending=sum(s.pending for s in states),
            unpublished=sum(line.unpublished for line in lines),
        )


def read_streams(session: Session, logs: LogEngine, group: str) -> list[StreamLine]:
    """Every binding (up to MAX_LINES) with its lag."""
    rows = session.execute(_BINDINGS, {"limit": MAX_LINES}).all()
    return _with_states(rows, logs, group)


def _with_states(rows: Sequence[Row[Any]], logs: LogEngine, group: str) -> list[StreamLine]:
    try:
        states = logs.group_states(group, [r.input for r in rows])
        reachable = True
    except (redis.RedisError, OSError) as exc:
        logger.warning("stream lag not read: %s", type(exc).__name__)
        states, reachable = {}, False
    return [_line(r, states.get(r.input), reachable) for r in rows]


def _line(r: Row[Any], state: GroupState | None, reachable: bool) -> StreamLine:
    return StreamLine(r.id, r.tenant, r.model, r.input, r.output, r.dead_letter, r.paused,
                      int(r.unpublished), state, reachable)  # fmt: skip


class StreamCollector(Collector):
    """The stream gauges, read at scrape time by the API (only it serves them, so
    they are never counted twice). Labelled by tenant and input log."""

    def __init__(self, engine: Engine, logs: LogEngine, group: str) -> None:
        self.engine, self.logs, self.group = engine, logs, group

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "inference_streams_up", "1 if the stream gauges could be read (PostgreSQL and Redis)"
        )
        read = read_at_scrape(self.engine, "stream gauges", _BINDINGS, limit=MAX_LINES)
        if read is None:
            up.add_metric([], 0)
            yield up
            return
        lines = _with_states(read[0], self.logs, self.group)
        up.add_metric([], 1 if all(line.reachable for line in lines) else 0)
        yield up
        labels = ["tenant", "stream"]
        lag = GaugeMetricFamily(
            "inference_stream_lag",
            "Entries of a binding's input log not yet read by its consumer group (on Redis "
            "6.2: counted up to 1000)", labels=labels,
        )  # fmt: skip
        behind = GaugeMetricFamily(
            "inference_stream_lag_seconds",
            "Age of the oldest entry not yet read (0: none)", labels=labels,
        )  # fmt: skip
        pending = GaugeMetricFamily(
            "inference_stream_pending",
            "Entries read and not yet acknowledged (held while a queue or quota is full)",
            labels=labels,
        )
        unpublished = GaugeMetricFamily(
            "inference_stream_unpublished",
            "Entries accepted whose result is not yet in the output log", labels=labels,
        )  # fmt: skip
        for line in lines:
            key = [line.tenant, line.input]
            unpublished.add_metric(key, line.unpublished)
            if line.state is not None:
                if line.state.lag is not None:
                    lag.add_metric(key, line.state.lag)
                behind.add_metric(key, line.state.behind_s)
                pending.add_metric(key, line.state.pending)
        yield from (lag, behind, pending, unpublished)
