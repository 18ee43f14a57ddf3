"""CPU seconds spent by each role of a contender (API, worker, PostgreSQL, ...),
and the processes' memory.

Throughput alone does not say where a job's time goes; CPU per job per role does,
and on a machine with two cores it is what decides throughput. Each role is a
set of process trees. A process's CPU is its own user+system time plus that of
its children it has reaped (`/proc/<pid>/stat` cutime/cstime), so a backend or a
worker child that exits between two samples is still counted, by its parent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import psutil

# Names a process's role from its command line; None means "its parent's role".
Classifier = Callable[[list[str]], str | None]
# Servers every contender uses (Context.shared_trees), not its own processes.
SHARED_ROLES = ("postgres", "redis")


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def _children_by_parent() -> dict[int, list[psutil.Process]]:
    """Every process of the machine by its parent's pid, from one pass over /proc
    (psutil's `children()` makes a pass for each process asked: sampling 40
    processes ten times a second cost the bench a core of the two it shares)."""
    children: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc)
    return children


def _tree(
    root: psutil.Process, children: dict[int, list[psutil.Process]]
) -> Iterable[tuple[psutil.Process, psutil.Process | None]]:
    """(process, parent) for `root` and every descendant, parents first."""
    yield root, None
    stack = [root]
    while stack:
        parent = stack.pop()
        for child in children.get(parent.pid, ()):
            yield child, parent
            stack.append(child)


@dataclass
class RoleMeter:
    """Samples CPU seconds per role. `trees` maps a root pid to its default role;
    `classify` may give a descendant a role of its own (gunicorn → api, ...)."""

    trees: dict[int, str] = field(default_factory=dict)
    classify: Classifier = lambda _cmdline: None
    client: bool = True  # count this process's own CPU as the role "client"
    # A process's own role by its command line, read once per (pid, start time).
    _classified: dict[tuple[int, float], str | None] = field(default_factory=dict)

    def processes(self) -> Iterator[tuple[psutil.Process, str]]:
        """Every process of every tree, with its role."""
        children = _children_by_parent()
        for pid, default_role in self.trees.items():
            try:
                root = psutil.Process(pid)
            except psutil.Error:
                continue
            roles: dict[int, str] = {}
            for proc, parent in _tree(root, children):
                try:
                    role = self._role_of(proc) if parent is not None else None
                except psutil.Error:
                    continue
                inherited = roles.get(parent.pid, default_role) if parent else default_role
                roles[proc.pid] = role or inherited
                yield proc, roles[proc.pid]

    def own_processes(self) -> list[tuple[psutil.Process, str]]:
        """The contender's own processes with their roles: not the shared servers'."""
        return [(proc, role) for proc, role in self.processes() if role not in SHARED_ROLES]

    def _role_of(self, proc: psutil.Process) -> str | None:
        key = (proc.pid, proc.create_time())
        if key not in self._classified:
            self._classified[key] = self.classify(proc.cmdline())
        return self._classified[key]

    def sample(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for proc, role in self.processes():
            try:
                totals[role] = totals.get(role, 0.0) + _cpu_seconds(proc)
            except psutil.Error:
                continue
        if self.client:
            own = psutil.Process(os.getpid()).cpu_times()
            totals["client"] = float(own.user + own.system)
        return totals


def rss_mb(proc: psutil.Process) -> float | None:
    """Resident memory in MiB; None once the process has gone."""
    try:
        return float(proc.memory_info().rss) / 2**20
    except psutil.Error:
        return None


def per_job_ms(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    """CPU milliseconds per job for each role between two samples."""
    if jobs <= 0:
        return {}
    roles = sorted(set(before) | set(after))
    deltas = {r: max(0.0, after.get(r, 0.0) - before.get(r, 0.0)) for r in roles}
    result = {r: round(1000 * d / jobs, 3) for r, d in deltas.items()}
    result["total"] = round(sum(v for k, v in result.items() if k != "client"), 3)
    return result
