"""Small disks for the full-disk scenarios: a tmpfs of a few MiB mounted where a
part of the stack keeps its data (PostgreSQL's data directory, the file store),
filled by a file of the suite's own, and space given back by deleting it.

Mounting needs root (or CAP_SYS_ADMIN); where the machine refuses, the scenario
is skipped saying so. A mount is taken away after the processes on it are gone
(lazily, if something still holds it), also when the scenario fails.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from app.platform.settings import ROOT
from tests.faults.harness import FaultStack

FILLER = "filler"


def mount_tmpfs(path: Path, mib: int) -> None:
    """A tmpfs of `mib` MiB at `path` (created, empty); skips the test where the
    machine refuses to mount one."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={mib}m,mode=0700"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        reason = done.stderr.strip() or f"exit status {done.returncode}"
        pytest.skip(f"this machine refuses to mount a tmpfs ({reason}): the full-disk "
                    "scenarios need a small disk of their own (root or CAP_SYS_ADMIN)")  # fmt: skip


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(where: Path, leave: int = 0) -> Path:
    """Fill the disk under `where` with a file of ours, up to `leave` bytes from
    full (rounded to the disk's pages); returns the file, whose deletion gives
    the space back."""
    filler = where / FILLER
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for block in (1 << 20, 1 << 12):
            data = b"\0" * block
            try:
                while os.write(fd, data):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        os.fsync(fd)
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def disk_stack(
    model_repository: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., FaultStack]]:
    """`disk_stack(guards_off, pg_mib=, store_mib=, **env)`: a stack (as make_stack's)
    whose PostgreSQL data directory (`root/pg`, mounted before initdb) and/or file
    store (`root/store`, FILE_STORE_URL) lie on a tmpfs of that many MiB. After the
    test, the fillers go, the stack is closed (its processes killed, PostgreSQL
    stopped), then the tmpfs are unmounted; a failed test's logs are kept."""
    with ExitStack() as cleanup:

        def make(guards_off: str = "", *, pg_mib: int = 0, store_mib: int = 0,
                 **env: str) -> FaultStack:  # fmt: skip
            root = ROOT / "var" / "test" / f"fault-{uuid.uuid4().hex[:8]}"
            cleanup.callback(shutil.rmtree, root, ignore_errors=True)
            for name, mib in (("pg", pg_mib), ("store", store_mib)):
                if mib:
                    mount_tmpfs(root / name, mib)
                    cleanup.callback(unmount, root / name)
            if store_mib:
                env["FILE_STORE_URL"] = str(root / "store")
            stack = FaultStack(root, model_repository, guards_off, **env)
            cleanup.callback(close, stack)
            return stack

        def close(stack: FaultStack) -> None:
            for name in ("pg", "store"):
                (stack.root / name / FILLER).unlink(missing_ok=True)
            outcome = getattr(request.node, "rep_call", None)
            if outcome is not None and outcome.failed:
                stack.keep_logs(ROOT / "var" / "test" / "fault-logs" / request.node.name)
            stack.close()

        yield make
