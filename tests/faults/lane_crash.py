"""Staged crashes of a worker's sync lane, for the fault suite's worker entry point.

With FAULTS_LANE_CRASH_FILE naming a file, `install()` wraps two points of the
lane (app.sync.lane.Lane); a worker child that reaches the point named in that
file SIGKILLs itself there, as the OOM killer would. The file is renamed
(`<file>.fired`) first, atomically, so a point fires once however many threads
reach it; the test writes the file again to arm the next one.

- `taken`: right after a lane thread took calls (they sit in its taken list),
  before running them: nobody was answered;
- `answered`: right after the step that answered calls and journaled their
  records, before the records were written to PostgreSQL.

Nothing here runs in the service's own processes: only tests.faults.worker
imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.sync.lane import Lane
from tests.faults.decode_crash import armed, fire

CRASH_FILE_VARIABLE = "FAULTS_LANE_CRASH_FILE"
POINTS = ("taken", "answered")


def _fire(path: Path, point: str) -> None:
    if armed(path, point):
        fire(path, point, "the sync lane")


def install(path: Path) -> None:
    take: Callable[..., list[bytes]] = Lane.take
    answer: Callable[..., Any] = Lane.answer

    def staged_take(self: Lane, *args: Any, **kwargs: Any) -> list[bytes]:
        taken = take(self, *args, **kwargs)
        if taken:
            _fire(path, "taken")
        return taken

    def staged_answer(self: Lane, *args: Any, **kwargs: Any) -> Any:
        answered = answer(self, *args, **kwargs)
        if answered[1]:  # calls answered, their records journaled (guard on) or not
            _fire(path, "answered")
        return answered

    Lane.take = staged_take  # type: ignore[method-assign]
    Lane.answer = staged_answer  # type: ignore[method-assign]


def install_from_env() -> None:
    if name := os.environ.get(CRASH_FILE_VARIABLE):
        install(Path(name))
