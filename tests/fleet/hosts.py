"""Hosts of a fleet on one machine, so a test can fail a whole host as a real one fails.

Each host is a network namespace with its own address on a private bridge, and its own
cgroups (v1): a CPU quota (a small machine), CPU accounting (what the host cost) and a
freezer (a host that stops answering, as under a long GC pause or a hung VM). Every
process a host spawns joins its cgroups before it executes, so its children count too.

Neighbour (ARP) entries are static, in every namespace and the root one: with no ARP to
fail, a host detached from the bridge is silent both ways and its peers see timeouts,
not the "No route to host" that failed neighbour resolution would give them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuacct", "freezer")
PERIOD_US = 100_000
IP = shutil.which("ip") or "/sbin/ip"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([IP, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _mac(address: str) -> str:
    """A fixed MAC per address, so static neighbour entries can be written in advance."""
    return "02:00:" + ":".join(f"{int(part):02x}" for part in address.split("."))


def _neighbour(ns: list[str], address: str, dev: str) -> None:
    _ip(*ns, "neigh", "replace", address, "lladdr", _mac(address), "dev", dev, "nud", "permanent")


def _wait(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _empty(cgroup: Path) -> Callable[[], bool]:
    return lambda: not _procs(cgroup)


def _signal_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _set_freezer(cgroup: Path, state: str) -> None:
    """Write `state` and wait until it is reached (FREEZING is the way to FROZEN)."""
    (cgroup / "freezer.state").write_text(state)
    _wait(lambda: (cgroup / "freezer.state").read_text().strip() == state, 30, state)


def _kill_cgroup(freezer: Path, reap: Callable[[], None] = lambda: None) -> None:
    """SIGKILL every process in a freezer cgroup. Frozen first, so nothing forks between
    the reading of the list and the signal; thawed after, as a frozen process dies only
    once it runs again."""
    deadline = time.monotonic() + 30
    while _procs(freezer):
        _set_freezer(freezer, "FROZEN")
        _signal_all(_procs(freezer))
        _set_freezer(freezer, "THAWED")
        reap()
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes left in {freezer}: {_procs(freezer)}")
        time.sleep(0.01)
    reap()


class Host:
    """One machine of the fleet: its namespace, address, cgroups and processes."""

    def __init__(self, fleet: Fleet, name: str, address: str) -> None:
        self.fleet = fleet
        self.name = name
        self.address = address
        self.netns = f"{fleet.prefix}-{name}"
        self.link = self.netns[:15]  # the root side of the veth pair; IFNAMSIZ is 16
        self.processes: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address})"

    def cgroup(self, controller: str) -> Path:
        return CGROUPS / controller / self.fleet.prefix / self.name

    def spawn(
        self, name: str, args: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `args` in this host: its namespace and cgroups, output to logs/HOST-NAME.log."""
        log = self.fleet.root / "logs" / f"{self.name}-{name}.log"
        procs = [str(self.cgroup(c) / "cgroup.procs") for c in CONTROLLERS]

        def enter() -> None:  # in the child, before exec: all it starts is counted here
            pid = str(os.getpid()).encode()
            for path in procs:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)

        with log.open("ab") as out:
            proc = subprocess.Popen(
                [IP, "netns", "exec", self.netns, *self.own_hostname(args)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=enter,  # the one way to join before exec
            )
        self.processes.append(proc)
        return proc

    def own_hostname(self, args: list[str]) -> list[str]:
        """`args` in a UTS namespace of their own named after the host: the service
        tells machines apart by hostname (Celery's %h, per-machine locks), and the
        namespaces of `ip netns` share the machine's."""
        return [UNSHARE, "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *args]

    def _reap(self) -> None:
        for proc in self.processes:
            proc.poll()

    def kill(self) -> None:
        """SIGKILL every process of the host (a power cut), and wait until all are gone."""
        _kill_cgroup(self.cgroup("freezer"), self._reap)
        for proc in self.processes:  # out of the cgroup is not yet reaped: no zombies left
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def freeze(self) -> None:
        _set_freezer(self.cgroup("freezer"), "FROZEN")

    def thaw(self) -> None:
        _set_freezer(self.cgroup("freezer"), "THAWED")

    def isolate(self) -> None:
        """Off the bridge: packets to and from the host vanish, and nothing is reset."""
        _ip("link", "set", self.link, "nomaster")

    def rejoin(self) -> None:
        _ip("link", "set", self.link, "master", self.fleet.bridge)

    def cpu_seconds(self) -> float:
        return int((self.cgroup("cpuacct") / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        return _procs(self.cgroup("freezer"))

    def run(
        self,
        args: list[str],
        timeout: float = 60,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A short command in the namespace (not in the cgroups), its output captured."""
        return subprocess.run(
            [IP, "netns", "exec", self.netns, *self.own_hostname(args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
            cwd=cwd,
        )


class Fleet:
    """The bridge, the cgroup folders and the hosts; `close()` removes every trace."""

    def __init__(self, root: Path, prefix: str = "fl", subnet: str = "10.213.0") -> None:
        self.root = root
        self.prefix = prefix
        self.subnet = subnet
        self.bridge = f"{prefix}br0"
        self.gateway = f"{subnet}.1"
        self.hosts: dict[str, Host] = {}
        self._closed = False
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        atexit.register(self.close)
        _ip("link", "add", "name", self.bridge, "type", "bridge", "forward_delay", "0")
        _ip("link", "set", self.bridge, "address", _mac(self.gateway), "up")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        for controller in CONTROLLERS:
            (CGROUPS / controller / prefix).mkdir(exist_ok=True)

    def add_host(self, name: str, cpu: float | None = None) -> Host:
        """A new namespace on the bridge at the next address; `cpu` caps it, in cores."""
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        host = Host(self, name, f"{self.subnet}.{len(self.hosts) + 2}")
        if any(other.link == host.link for other in self.hosts.values()):
            raise ValueError(f"link name {host.link!r} is taken: use a shorter host name")
        ns = ["-n", host.netns]
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", host.link, "master", self.bridge, "up")
        _ip(*ns, "link", "set", "lo", "up")
        _ip(*ns, "link", "set", "eth0", "address", _mac(host.address), "up")
        _ip(*ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        for other in [self.gateway, *(h.address for h in self.hosts.values())]:
            _neighbour(ns, other, "eth0")
        for other_host in self.hosts.values():
            _neighbour(["-n", other_host.netns], host.address, "eth0")
        _neighbour([], host.address, self.bridge)
        for controller in CONTROLLERS:
            host.cgroup(controller).mkdir(exist_ok=True)
        if cpu is not None:
            (host.cgroup("cpu") / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (host.cgroup("cpu") / "cpu.cfs_quota_us").write_text(str(int(cpu * PERIOD_US)))
        self.hosts[name] = host
        return host

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def close(self) -> None:
        """Kill every host's processes; delete namespaces, links, bridge and cgroups."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            with contextlib.suppress(OSError, TimeoutError):
                host.kill()
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Whatever this prefix left, by this run or a crashed earlier one."""
        for freezer in (CGROUPS / "freezer" / self.prefix).glob("*/"):
            _kill_cgroup(freezer)
        namespaces = _ip("netns", "list").stdout.split()
        for netns in (n for n in namespaces if n.startswith(f"{self.prefix}-")):
            _signal_all([int(pid) for pid in _ip("netns", "pids", netns).stdout.split()])
            _ip("netns", "del", netns, check=False)
        for link in json.loads(_ip("-j", "link", "show").stdout or "[]"):
            name = link["ifname"]
            if name.startswith(f"{self.prefix}-") or name == self.bridge:
                _ip("link", "del", name, check=False)
        for controller in CONTROLLERS:
            top = CGROUPS / controller / self.prefix
            for cgroup in [*top.glob("*/"), top]:
                with contextlib.suppress(FileNotFoundError):
                    _wait(_empty(cgroup), 10, f"{cgroup} to empty")
                    cgroup.rmdir()
