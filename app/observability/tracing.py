"""One trace per job (OpenTelemetry), on when OTEL_EXPORTER_OTLP_ENDPOINT is set.

A door takes a W3C `traceparent` from its request (an HTTP header, gRPC metadata,
a stream entry's field); admission makes a span under it, and the job keeps that
span's `traceparent` (its record shows the trace id), so the worker's spans (the
queue wait, the run, each pipeline step, the micro-batch's model call, linked to
every job it ran) and each webhook delivery join the same trace, across Celery
and the sync lane. Spans go to the OTLP/HTTP endpoint in batches from a thread of
each process (set up again after a fork). Without the endpoint nothing is made,
and a `traceparent` received is still kept with the job.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, TraceFlags

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACEPARENT = "traceparent"
_HEADER = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_tracer: trace.Tracer = trace.NoOpTracer()
_provider: Any = None
_lock = threading.Lock()


def setup(service: str, endpoint: str | None = None) -> bool:
    """Export this process's spans to `endpoint` (default: OTEL_EXPORTER_OTLP_ENDPOINT)
    as `service`; False (and no spans) without one. Called again after a fork."""
    global _tracer, _provider
    endpoint = endpoint or os.environ.get(ENDPOINT, "")
    if not endpoint:
        return False
    with _lock:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        _tracer, _provider = provider.get_tracer("inference"), provider
        return True


def shutdown() -> None:
    """Send what is buffered and stop (a process on its way out, a test's end)."""
    global _tracer, _provider
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _tracer, _provider = trace.NoOpTracer(), None


def on() -> bool:
    return _provider is not None


def parsed(traceparent: str | None) -> SpanContext | None:
    """The span context a W3C traceparent names, None when it is not one."""
    match = _HEADER.fullmatch((traceparent or "").strip().lower())
    if match is None or set(match[1]) == {"0"} or set(match[2]) == {"0"}:
        return None
    return SpanContext(int(match[1], 16), int(match[2], 16), is_remote=True,
                       trace_flags=TraceFlags(int(match[3], 16)))  # fmt: skip


def valid(traceparent: str | None) -> str | None:
    """The traceparent if it is one (as sent), else None: a malformed one is dropped."""
    return traceparent.strip().lower() if parsed(traceparent) is not None else None  # type: ignore[union-attr]


def trace_id(traceparent: str | None) -> str | None:
    context = parsed(traceparent)
    return f"{context.trace_id:032x}" if context is not None else None


def header(span: Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def start(
    name: str, parent: str | None, *, at: datetime | None = None,
    links: Sequence[str | None] = (), **attributes: Any,
) -> Span:  # fmt: skip
    """A span under `parent` (a traceparent; a new trace without one), started `at`
    (default now), linked to the spans `links` name: end it with `.end()`."""
    context = parsed(parent)
    ctx = trace.set_span_in_context(NonRecordingSpan(context)) if context else None
    start_ns = int(at.timestamp() * 1e9) if at is not None else None
    linked = [Link(c) for c in map(parsed, links) if c is not None]
    kept = {k: v for k, v in attributes.items() if v is not None}
    return _tracer.start_span(name, context=ctx, start_time=start_ns, links=linked,
                              attributes=kept)  # fmt: skip


@contextmanager
def spans(name: str, parents: Sequence[str | None]) -> Iterator[list[str | None]]:
    """`span` for each of many requests that came with a trace (a bulk's, a stream
    door's read); the others keep None."""
    if not on() or not any(parents):
        yield list(parents)
        return
    made = [start(name, parent) if parent else None for parent in parents]
    try:
        yield [header(s) if s is not None else None for s in made]
    finally:
        for s in made:
            if s is not None:
                s.end()


@contextmanager
def span(name: str, parent: str | None, **attributes: Any) -> Iterator[str | None]:
    """A span around the block; yields what a job made in it keeps: the span's own
    traceparent, or `parent` as it came when tracing is off."""
    if not on():
        yield parent
        return
    made = start(name, parent, **attributes)
    try:
        yield header(made)
    finally:
        made.end()
