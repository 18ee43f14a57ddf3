"""A TCP proxy on loopback that a fault scenario can cut and heal, to stage a
network partition between one process and a server.

Why a proxy: the suite's PostgreSQL and Redis listen on unix sockets under the
scenario's folder, and network namespaces need root; a process pointed at the
proxy's port instead reaches the same server, and only that process is cut off.

A cut behaves as a partition does, not as a crash: nothing is closed or reset.
The proxy stops reading from both sides of every connection, so what a peer
sends fills the kernel's buffers and then blocks its writes, and a reply it
waits for never comes (as packets retransmitted into a black hole). A
connection opened meanwhile is accepted by the kernel but gets no answer (the
proxy neither reads it nor connects it on). `heal()` resumes forwarding, so
what was held back arrives late, as after retransmission, and an end that
closed meanwhile (a server that gave up on its client) is closed on then.
One thread accepts, two per connection forward; all are daemons and `close()`
ends them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

CHUNK = 65536


class Proxy:
    def __init__(self, upstream: Path | tuple[str, int]) -> None:
        """`upstream`: a unix socket's path, or a TCP (host, port)."""
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()  # set: forwarding; clear: cut off
        self._open.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.connections = 0
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        """Stop: every socket closed, every thread let go."""
        self._closed = True
        self._open.set()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _forwarding(self) -> bool:
        """Wait while cut off; False once the proxy is closed."""
        self._open.wait()
        return not self._closed

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._keep(client)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        if not self._forwarding():  # a connection opened while cut waits here, unanswered
            return
        family = socket.AF_UNIX if isinstance(self.upstream, Path) else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        self._keep(server)
        try:
            server.connect(str(self.upstream) if isinstance(self.upstream, Path) else self.upstream)
        except OSError:
            self._drop(client, server)
            return
        self.connections += 1
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        self._pump(server, client)

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        """Forward one direction. While cut it blocks before reading (and before
        passing on what it had read), so the kernel's buffers fill behind it."""
        try:
            while self._forwarding():
                data = source.recv(CHUNK)
                if not self._forwarding():
                    return
                if not data:
                    target.shutdown(socket.SHUT_WR)
                    return
                target.sendall(data)
        except OSError:
            self._drop(source, target)

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._sockets.add(sock)

    def _drop(self, *sockets: socket.socket) -> None:
        with self._lock:
            for sock in sockets:
                self._sockets.discard(sock)
        for sock in sockets:
            sock.close()
