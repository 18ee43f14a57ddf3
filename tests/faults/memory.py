"""A memory limit the kernel enforces on a group of processes (a memory cgroup),
so that a scenario's worker child is ended by the kernel's OOM killer for real.

The group is made under this process's own memory cgroup: cgroup v1's memory
controller (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` so swap
cannot stand in for the limit), or cgroup v2's where it is delegated there
(`memory.max`, `memory.swap.max`). A process started in the group (`wrap`)
has everything it and the processes it forks allocate counted there, so a
limit can be set above what it holds once it is up (`usage`). `close` moves
whatever is left back out and removes the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


class Unavailable(Exception):
    """No memory cgroup can be made and limited here; the message says why."""


def _own(controller_line: str) -> str | None:
    """This process's path in the hierarchy whose /proc/self/cgroup line matches."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == controller_line or controller_line in controllers.split(","):
            return path
    return None


class MemoryCgroup:
    def __init__(self, path: Path, version: int) -> None:
        self.path, self.version = path, version

    @classmethod
    def make(cls, name: str) -> MemoryCgroup:
        """A group `name` under this process's own, its limit not set yet."""
        reasons = []
        own = _own("memory")
        if own is not None and V1_ROOT.is_dir():
            try:
                return cls._made(V1_ROOT / own.lstrip("/") / name, 1)
            except OSError as exc:
                reasons.append(f"cgroup v1 memory at {V1_ROOT}{own}: {exc}")
        else:
            reasons.append(f"no cgroup v1 memory controller at {V1_ROOT}")
        own = _own("")
        for root in V2_ROOTS:
            controllers = root / "cgroup.controllers"
            if own is None or not controllers.exists():
                continue
            parent = root / own.lstrip("/")
            delegated = (parent / "cgroup.subtree_control").read_text().split()
            if "memory" not in delegated:
                reasons.append(f"cgroup v2 at {root}: memory is not delegated to {parent}")
                continue
            try:
                return cls._made(parent / name, 2)
            except OSError as exc:
                reasons.append(f"cgroup v2 memory at {parent}: {exc}")
        raise Unavailable("; ".join(reasons) or "no cgroup hierarchy found")

    @classmethod
    def _made(cls, path: Path, version: int) -> MemoryCgroup:
        """The group, once a limit could be written to it (else it is removed)."""
        path.mkdir()
        group = cls(path, version)
        try:
            group.limit(1 << 40)
        except OSError:
            group.close()
            raise
        return group

    def limit(self, limit_bytes: int) -> None:
        """At most `limit_bytes` of memory, swap not counted as room beyond it."""
        if self.version == 1:
            swap = self.path / "memory.memsw.limit_in_bytes"
            # memory+swap may never be below memory: lowered after it, raised before
            order = ["memory.limit_in_bytes", swap.name]
            if swap.exists() and int(swap.read_text()) < limit_bytes:
                order.reverse()
            for name in order:
                if (self.path / name).exists():
                    (self.path / name).write_text(str(limit_bytes))
        else:
            (self.path / "memory.max").write_text(str(limit_bytes))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")

    def limit_bytes(self) -> int:
        name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        return int((self.path / name).read_text())

    def usage(self) -> int:
        """Bytes the group's processes are charged for now."""
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        return int((self.path / name).read_text())

    def wrap(self, args: list[str]) -> list[str]:
        """`args` run as a process that first enters the group (then execs them)."""
        procs = str(self.path / "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *args]

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def oom_kills(self) -> int:
        """Processes of the group the kernel's OOM killer ended."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise Unavailable(f"{self.path / name} does not count OOM kills")

    def close(self) -> None:
        """Move the processes left back to the parent group (a process forked
        meanwhile is moved in the next round; after a few, the rest is killed),
        then remove the group."""
        if not self.path.exists():
            return
        parent = self.path.parent / "cgroup.procs"
        for round_ in range(20):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):  # it ended meanwhile
                    if round_ < 10:
                        parent.write_text(str(pid))
                    else:
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        self.path.rmdir()
