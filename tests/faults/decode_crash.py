"""Staged crashes of a decode loop, for the fault suite's worker entry point.

With FAULTS_DECODE_CRASH_FILE naming a file, `install()` wraps three points of
the service's decode loop (app.engine.core, app.runtime.decode); a
worker child that reaches the point named in that file, once the condition
below holds, SIGKILLs itself there, as the OOM killer would. The file is
renamed (`<file>.fired`) first, atomically, so a point fires once however many
children reach it; the test writes the file again to arm the next one.

- `prefill`: inside a prompt's prefill (its cache rows written, its first token
  not yet made) while another sequence in the batch has text recorded;
- `decode`: inside a decode call (the batch's next tokens computed, none yet
  handed out) once a sequence has made PAST tokens;
- `recorded`: right after a unit of work recorded a piece of text of a job that
  has PAST tokens recorded, while the publisher still holds that job's newest
  text: recorded (an event stream shows it), not yet published (pub/sub never
  sees it).

Nothing here runs in the service's own processes: only tests.faults.worker
imports it. A random kill rarely lands at these points; a staged one always does.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.engine.core import Generation
from app.jobs.outputs import Piece
from app.runtime.decode import DecodeEngine
from app.runtime.sequences import Emitted

CRASH_FILE_VARIABLE = "FAULTS_DECODE_CRASH_FILE"
POINTS = ("prefill", "decode", "recorded")
PAST = 16  # tokens made (or recorded) before a point fires: a retry has text to resume from


def armed(path: Path, point: str) -> bool:
    try:
        return path.read_text().strip() == point
    except FileNotFoundError:
        return False


def fire(path: Path, point: str, where: str = "the decode loop") -> None:
    """SIGKILL this process, unless another one fired this point first."""
    try:
        os.rename(path, path.with_name(path.name + ".fired"))
    except FileNotFoundError:
        return
    print(f"staged crash in {where} at {point} (pid {os.getpid()})", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def install(path: Path) -> None:
    prefill: Callable[..., list[Emitted]] = DecodeEngine.prefill
    decode: Callable[..., list[Emitted]] = DecodeEngine.decode
    record: Callable[..., None] = Generation._record
    recorded: Counter[uuid.UUID] = Counter()  # tokens this process recorded, by job

    def staged_prefill(self: DecodeEngine, *args: Any, **kwargs: Any) -> list[Emitted]:
        emitted = prefill(self, *args, **kwargs)
        if armed(path, "prefill") and any(recorded[s.key] for s in self.decoding):
            fire(path, "prefill")
        return emitted

    def staged_decode(self: DecodeEngine) -> list[Emitted]:
        emitted = decode(self)
        if armed(path, "decode") and any(len(s.generated) >= PAST for s in self.decoding):
            fire(path, "decode")
        return emitted

    def staged_record(self: Generation, pieces: list[Piece]) -> None:
        record(self, pieces)  # committed
        for piece in pieces:
            recorded[piece.job_id] += len(piece.tokens)
        if armed(path, "recorded"):
            held = self.publisher._pending  # the text not yet published, by job
            if any(recorded[p.job_id] >= PAST and p.job_id in held and held[p.job_id].text
                   for p in pieces):  # fmt: skip
                fire(path, "recorded")

    DecodeEngine.prefill = staged_prefill  # type: ignore[method-assign]
    DecodeEngine.decode = staged_decode  # type: ignore[method-assign]
    Generation._record = staged_record  # type: ignore[method-assign]


def install_from_env() -> None:
    if name := os.environ.get(CRASH_FILE_VARIABLE):
        install(Path(name))
