"""The worker's spans of the runs it makes (app.observability.tracing): for each
job or sync call that came with a trace, its wait in the queue (from its
creation to now) and its run; and one span of the micro-batch's model call,
linked to every run it served."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from opentelemetry.trace import Span

from app.cards import ModelCard
from app.observability import tracing

Queued = tuple[str | None, datetime | float | None]  # (traceparent, when it was made)


@contextmanager
def traced_run(card: ModelCard, calls: Sequence[Queued]) -> Iterator[list[str | None]]:
    """Spans around a micro-batch's run; yields each call's run span (None where it
    came with no trace), under which its steps' spans go."""
    if not tracing.on() or not any(parent for parent, _ in calls):
        yield [None] * len(calls)
        return
    runs: list[Span | None] = []
    for parent, queued in calls:
        if parent is None:
            runs.append(None)
            continue
        if queued is not None:
            since = queued if isinstance(queued, datetime) else datetime.fromtimestamp(queued, UTC)
            tracing.start("queue wait", parent, at=since, model=card.ref).end()
        runs.append(tracing.start("run", parent, model=card.ref))
    headers: list[str | None] = [tracing.header(s) if s is not None else None for s in runs]
    batch = tracing.start("model run", None, links=headers, model=card.ref, requests=len(calls))
    try:
        yield headers
    finally:
        batch.end()
        for span in runs:
            if span is not None:
                span.end()
