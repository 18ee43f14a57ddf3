"""Reading streamed answers line by line as they arrive: Server-Sent Events
(per the WHATWG spec's parsing rules) and JSON Lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import requests
import urllib3

_READ = 65536


def chunks(response: requests.Response) -> Iterator[bytes]:
    """The body as it arrives. `read1` returns what one read gives, so an event
    is seen when it is sent, not once 64 KiB have piled up behind it."""
    while True:
        try:
            data = response.raw.read1(_READ, decode_content=True)
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # what requests would wrap
            raise requests.ConnectionError(exc, response=response) from exc
        if not data:
            return
        yield data


def lines(parts: Iterable[bytes]) -> Iterator[bytes]:
    """Lines ended by CRLF, LF or CR (as SSE allows), without their ends; a last
    line without an end is yielded too."""
    buffer = b""
    for part in parts:
        scan = max(len(buffer) - 1, 0)  # what was scanned before holds no line end but a last CR
        buffer += part
        start = 0
        while True:
            cr, lf = buffer.find(b"\r", scan), buffer.find(b"\n", scan)
            end = min(i for i in (cr, lf, len(buffer)) if i >= 0)
            if end == len(buffer) or (end == cr and end + 1 == len(buffer)):
                break  # no line end yet, or a CR at the end: an LF may follow
            yield buffer[start:end]
            start = scan = end + (2 if buffer[end : end + 2] == b"\r\n" else 1)
        buffer = buffer[start:]
    if buffer:
        yield buffer.removesuffix(b"\r")


@dataclass
class RawEvent:
    id: str | None
    type: str
    data: str


@dataclass
class _Pending:
    type: str = ""
    data: list[str] = field(default_factory=list)


def sse(parts: Iterable[bytes]) -> Iterator[RawEvent]:
    """Events of a text/event-stream; comments (keepalives) are skipped. An event
    cut off before its blank line is not dispatched, as the spec says."""
    last_id: str | None = None
    pending = _Pending()
    for raw in lines(parts):
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if pending.data:
                yield RawEvent(last_id, pending.type or "message", "\n".join(pending.data))
            pending = _Pending()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            pending.data.append(value)
        elif name == "event":
            pending.type = value
        elif name == "id" and "\0" not in value:
            last_id = value


def jsonl(parts: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    for line in lines(parts):
        if line.strip():
            row: dict[str, Any] = json.loads(line)
            yield row
