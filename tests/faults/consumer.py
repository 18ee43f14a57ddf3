"""The fault suite's stream consumer: `python -m tests.faults.consumer`.

The service's own (app.streams.process.run) over a container whose guards named
in FAULTS_GUARDS_OFF are off (ack, redelivery, dedupe among them), and, with
FAULTS_CRASH_AT=<point>:<n>, a process that SIGKILLs itself the n-th time it
reaches that checkpoint: `accepted` (a batch recorded and not yet acknowledged;
with the `ack` guard off, acknowledged and not yet recorded) or `published`
(results appended to the output log and not yet recorded as published). A
random kill rarely lands in those few milliseconds; a staged one always does.
Only the fault suite's harness starts it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

from app.container import Container
from app.platform.embedded import resolve_urls
from app.platform.settings import Settings
from app.streams.process import run
from tests.faults.guards import guards_from_env


def crash_at(spec: str) -> tuple[str, int]:
    point, _, nth = spec.partition(":")
    return point, int(nth or 1)


def main() -> None:
    spec = os.environ.get("FAULTS_CRASH_AT", "")
    target = crash_at(spec) if spec else None
    passes: Counter[str] = Counter()
    lock = threading.Lock()

    def checkpoint(point: str) -> None:
        with lock:
            passes[point] += 1
            if target is not None and (point, passes[point]) == target:
                print(f"staged crash at {point} #{passes[point]}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    container = Container(resolve_urls(Settings.from_env()), guards=guards_from_env())
    run(container, checkpoint=checkpoint)


if __name__ == "__main__":
    main()
