"""A user-space TCP proxy that delays every chunk, as a network between hosts would.

Run in the data host in front of PostgreSQL and Redis, so every other host pays a round
trip on each query, as across a real network (the kernel here has no netem or packet
filter to do it). One asyncio thread forwards every connection: it carries thousands of
small messages a second, so it is written on protocols and timers, not streams.

Each direction of a connection is a queue of chunks with the time each is due:
`max(previous due time, now + delay ± uniform jitter)`, so chunks are late by the delay
but never reordered. The reader of a direction pauses while its queue or the writer's
buffer is large (backpressure). When one end closes, the other is closed once what it
was sent has been delivered.

`cut ADDR` on the control socket partitions one source host as a silent packet drop
would: its connections are neither read nor written, what was scheduled for them is
held, and a new connection from it is accepted (by the kernel) but gets no upstream
and no byte back. Nothing is closed or reset. `heal ADDR` delivers what was held and
connects the waiting ones on. `stats` answers one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import socket
from collections.abc import Callable
from typing import cast

HIGH_WATER = 1 << 20  # bytes queued in a direction before its reader pauses
# epoll waits in whole milliseconds, rounded up: timers are set this much early and a
# flush delivers what is due this much ahead, so the mean delay is the one asked for.
SLACK = 0.0005


class Side(asyncio.Protocol):
    """One end of a proxied connection; what it reads goes into `out`."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.out: Pipe
        self.into: Pipe
        self.writer_paused = False  # our transport's write buffer is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.link.made(self)

    def data_received(self, data: bytes) -> None:
        self.out.push(data)

    def eof_received(self) -> bool:
        self.out.push(None)
        return True  # stays open until the end is delivered to the other side

    def connection_lost(self, exc: Exception | None) -> None:
        self.out.push(None)

    def pause_writing(self) -> None:
        self.writer_paused = True
        self.into.source.update_reading()

    def resume_writing(self) -> None:
        self.writer_paused = False
        self.into.source.update_reading()

    def update_reading(self) -> None:
        """Read while the link is not cut and the way onward has room."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = self.out
        want = not self.link.cut and out.queued < HIGH_WATER and not out.dest.writer_paused
        if want != transport.is_reading():
            (transport.resume_reading if want else transport.pause_reading)()


class Pipe:
    """One direction: chunks (None is the end) with their due times, in order."""

    def __init__(self, link: Link, source: Side, dest: Side, counter: str) -> None:
        self.link = link
        self.source = source
        self.dest = dest
        self.counter = counter
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.queued = 0
        self.last_at = 0.0
        self.ended = False
        self.timer: asyncio.TimerHandle | None = None

    def push(self, data: bytes | None) -> None:
        if self.ended or self.link.closed:
            return
        proxy = self.link.proxy
        jitter = random.uniform(-proxy.jitter, proxy.jitter) if proxy.jitter else 0.0
        self.last_at = max(self.last_at, proxy.loop.time() + proxy.delay + jitter)
        self.queue.append((self.last_at, data))
        if data is None:
            self.ended = True
        else:
            self.queued += len(data)
            proxy.counters[self.counter] += len(data)
            self.source.update_reading()
        self.schedule()

    def schedule(self) -> None:
        if self.timer is None and self.queue and not self.link.cut and self.dest.transport:
            self.timer = self.link.proxy.loop.call_at(self.queue[0][0] - SLACK, self.flush)

    def flush(self) -> None:
        self.timer = None
        transport = self.dest.transport
        if self.link.cut or transport is None or self.link.closed:
            return
        due = self.link.proxy.loop.time() + SLACK
        chunks: list[bytes] = []
        while self.queue and self.queue[0][0] <= due:
            data = self.queue.popleft()[1]
            if data is None:
                if chunks:
                    transport.write(b"".join(chunks))
                self.link.close()
                return
            chunks.append(data)
            self.queued -= len(data)
        if chunks:
            transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        self.schedule()
        self.source.update_reading()


class Link:
    """A client connection and its upstream one."""

    def __init__(self, proxy: Proxy, upstream: tuple[str, int]) -> None:
        self.proxy = proxy
        self.upstream = upstream
        self.client = Side(self)
        self.server = Side(self)
        self.client.out = self.client_to_server = Pipe(self, self.client, self.server, "up")
        self.server.out = self.server_to_client = Pipe(self, self.server, self.client, "down")
        self.client.into, self.server.into = self.server_to_client, self.client_to_server
        self.address = ""
        self.cut = False
        self.closed = False
        self.connecting = False

    def made(self, side: Side) -> None:
        if self.closed:  # the client left while its upstream connection was being made
            assert side.transport is not None
            side.transport.close()
            return
        if side is self.client:
            assert side.transport is not None
            self.address = side.transport.get_extra_info("peername")[0]
            self.proxy.links.add(self)
            self.cut = self.address in self.proxy.cut_addresses
        side.update_reading()
        if side is self.client and not self.cut:
            self.connect()
        elif side is self.server:
            self.client_to_server.schedule()

    def connect(self) -> None:
        if self.connecting or self.closed:
            return
        self.connecting = True
        self.proxy.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await self.proxy.loop.create_connection(lambda: self.server, *self.upstream)
        except OSError:
            self.server_to_client.push(None)  # refused upstream: the client is closed, late

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        for side in (self.client, self.server):
            side.update_reading()
        if not cut:
            if self.server.transport is None:
                self.connect()
            self.client_to_server.schedule()
            self.server_to_client.schedule()

    def close(self) -> None:
        """Both ends closed; what their write buffers hold is still sent."""
        if self.closed:
            return
        self.closed = True
        self.proxy.links.discard(self)
        for pipe in (self.client_to_server, self.server_to_client):
            if pipe.timer is not None:
                pipe.timer.cancel()
        for side in (self.client, self.server):
            if side.transport is not None:
                side.transport.close()


class Proxy:
    def __init__(self, loop: asyncio.AbstractEventLoop, delay_ms: float, jitter_ms: float) -> None:
        self.loop = loop
        self.delay = delay_ms / 1000
        self.jitter = jitter_ms / 1000
        self.links: set[Link] = set()
        self.cut_addresses: set[str] = set()
        self.counters = {"up": 0, "down": 0}

    def set_cut(self, address: str, cut: bool) -> None:
        (self.cut_addresses.add if cut else self.cut_addresses.discard)(address)
        for link in list(self.links):
            if link.address == address:
                link.set_cut(cut)

    def stats(self) -> dict[str, object]:
        return {
            "connections": len(self.links),
            "held": sum(link.cut for link in self.links),
            "bytes_up": self.counters["up"],
            "bytes_down": self.counters["down"],
            "cut": sorted(self.cut_addresses),
        }

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One command a line: `cut ADDR`, `heal ADDR`, `stats`."""
        while line := await reader.readline():
            command, _, argument = line.decode().strip().partition(" ")
            if command in ("cut", "heal") and argument:
                self.set_cut(argument.strip(), command == "cut")
                writer.write(b"ok\n")
            elif command == "stats":
                writer.write(json.dumps(self.stats()).encode() + b"\n")
            else:
                writer.write(f"error: unknown command {line.decode().strip()!r}\n".encode())
            await writer.drain()
        writer.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _factory(proxy: Proxy, upstream: tuple[str, int]) -> Callable[[], Side]:
    return lambda: Link(proxy, upstream).client


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    proxy = Proxy(loop, args.delay_ms, args.jitter_ms)
    for pair in args.listen:
        listen, _, upstream = pair.partition("=")
        factory = _factory(proxy, _address(upstream))
        await loop.create_server(factory, *_address(listen), backlog=1024)
    if os.path.exists(args.control):
        os.unlink(args.control)
    await asyncio.start_unix_server(proxy.control, args.control)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"delay proxy ready: {' '.join(args.listen)}", flush=True)
    await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--listen", action="append", required=True, help="ADDR:PORT=HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--jitter-ms", type=float, default=0.5)
    parser.add_argument("--control", required=True, help="path of the control unix socket")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
