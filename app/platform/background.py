"""Background threads of a serving process, started on first use."""

from __future__ import annotations

import threading
from collections.abc import Callable


class LazyThread:
    """A daemon thread started by the first call of `ensure()`: after the API server or
    Celery forked the process (threads do not survive a fork), only where it is
    needed, and again if it died."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target, self._name = target, name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._target, name=self._name, daemon=True
                    )
                    self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the thread to end (after its target was told to)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
