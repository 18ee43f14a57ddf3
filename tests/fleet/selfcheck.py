"""Smoke test of the fleet layer, run as root: `.venv/bin/python -m tests.fleet.selfcheck`.

It builds a fleet (data, a capped at 0.25 core, b), starts the data servers and checks
what the layer promises: the proxy's round trip, the CPU cap, a partition that is
silent, freeze, kill, isolate, crash-like restarts that keep data, and a clean close.
The probes (tests.fleet.probes) run as processes of the hosts, since what matters is
what a process in a host sees.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg2
import redis

from tests.fleet.data import DataServers
from tests.fleet.hosts import Fleet, Host

REPO = Path(__file__).resolve().parents[2]
PREFIX, SUBNET = "flck", "10.213.9"  # apart from a fleet the tests may have up
PROBE = [sys.executable, "-m", "tests.fleet.probes"]


def _running(pid: int) -> bool:
    """Not gone, nor a zombie (orphans are reaped by init, in its own time)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class Check:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fleet = Fleet(root, prefix=PREFIX, subnet=SUBNET)
        self.data = self.fleet.add_host("data")
        self.a = self.fleet.add_host("a", cpu=0.25)
        self.b = self.fleet.add_host("b")
        self.servers = DataServers(self.data, root / "data")
        self.env = dict(os.environ)
        self.failures: list[str] = []
        self.serial = 0
        self.probes: dict[Path, subprocess.Popen[bytes]] = {}

    def expect(self, ok: bool, what: str, figures: object) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {figures}", flush=True)
        if not ok:
            self.failures.append(what)

    def spawn(self, host: Host, kind: str, *args: str) -> Path:
        """A probe in `host`; returns its log."""
        self.serial += 1
        name = f"{kind}{self.serial}"
        log = self.root / "logs" / f"{host.name}-{name}.log"
        self.probes[log] = host.spawn(name, [*PROBE, kind, *args], self.env, REPO)
        return log

    def lines(self, log: Path, count: int = 1, timeout: float = 60) -> list[dict[str, Any]]:
        """The first `count` JSON lines of a probe's log, waited for."""
        deadline = time.monotonic() + timeout
        while True:
            exited = self.probes[log].poll() is not None  # before reading: then all is read
            text = log.read_text() if log.exists() else ""
            found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            if len(found) >= count:
                return found
            if exited or time.monotonic() > deadline:
                raise RuntimeError(f"no answer in {log}: {text[-2000:]}")
            time.sleep(0.02)

    def run_probe(self, host: Host, kind: str, *args: str) -> dict[str, Any]:
        """A probe run with host.run: in the namespace, outside the cgroups."""
        result = host.run([*PROBE, kind, *args])
        found: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
        return found

    def all(self) -> None:
        started = time.monotonic()
        self.servers.start()
        print(f"data servers up in {time.monotonic() - started:.1f} s", flush=True)
        s, a, b, data = self.servers, self.a, self.b, self.data
        # 1. round trips: through the proxy from a and b; direct inside the data host
        for host in (a, b):
            rtt = self.lines(self.spawn(host, "rtt", s.database_url, s.redis_url, "200"))[0]
            ok = all(3.5 < rtt[key] < 8 for key in ("pg_ms", "redis_ms"))
            self.expect(ok, f"median round trip from {host.name} through the proxy", rtt)
        local = ("postgresql://postgres@127.0.0.1:5432/inference", "redis://127.0.0.1:6379/0")
        direct = self.run_probe(data, "rtt", *local, "200")
        self.expect(max(direct.values()) < 1, "median round trip inside the data host", direct)
        # proxy CPU: 10,000 PINGs from b on 50 connections
        assert s.proxy is not None
        proxy = psutil.Process(s.proxy.pid)
        before, data_before = sum(proxy.cpu_times()[:2]), data.cpu_seconds()
        load = self.lines(self.spawn(b, "load", s.redis_url, "50", "10000"), timeout=300)[0]
        cost = {
            "wall_s": round(load["seconds"], 2),
            "proxy_cpu_s": round(sum(proxy.cpu_times()[:2]) - before, 2),
            "data_host_cpu_s": round(data.cpu_seconds() - data_before, 2),
        }
        self.expect(True, "10,000 redis PINGs through the proxy", cost)
        # 2. CPU cap: busy loops in a (0.25 core) and b (no cap), measured over 3 s
        busy = [self.spawn(host, "busy", "5") for host in (a, b)]
        for log in busy:
            self.lines(log)
        a0, b0, started = a.cpu_seconds(), b.cpu_seconds(), time.monotonic()
        time.sleep(3)
        used = {"a": a.cpu_seconds() - a0, "b": b.cpu_seconds() - b0}
        figures: dict[str, object] = {k: round(v, 2) for k, v in used.items()}
        figures["wall_s"] = round(time.monotonic() - started, 2)
        ok = 0.65 < used["a"] < 0.85 and 2.7 < used["b"] < 3.2
        self.expect(ok, "CPU seconds over 3 s of busy loops, a capped at 0.25", figures)
        # 3. partition of a from the data host
        flags = self.root / "flags"
        flags.mkdir(exist_ok=True)
        hold = self.spawn(a, "hold", s.redis_url, str(flags))
        self.lines(hold)
        s.cut(a.address)
        (flags / "cut").touch()
        during = self.lines(hold, 2, timeout=30)[1]
        other = self.lines(self.spawn(b, "ping", s.redis_url))[0]
        stats = s.stats()
        s.heal(a.address)
        (flags / "healed").touch()
        after = self.lines(hold, 3)[2]
        ok = all(during[k]["result"] == "timeout" and during[k]["seconds"] >= 1.9 for k in during)
        self.expect(ok, "a cut off: PING on its connection and a new one", during)
        self.expect(other["result"] == "ok", "b while a is cut", other)
        self.expect(after["healed"]["result"] == "ok", "a healed, new connection", after)
        print(f"     proxy stats while cut: {stats}", flush=True)
        # 4. freeze: a counter in b stops
        count = self.root / "count"
        self.spawn(b, "counter", str(count))
        while not count.exists() or not count.read_text():
            time.sleep(0.02)
        time.sleep(0.3)
        b.freeze()
        frozen = int(count.read_text())
        time.sleep(1)
        still = int(count.read_text())
        b.thaw()
        time.sleep(0.5)
        thawed = int(count.read_text())
        figures = {"frozen": frozen, "1 s later": still, "0.5 s after thaw": thawed}
        self.expect(frozen == still < thawed, "counter across freeze/thaw", figures)
        # 5. isolate/rejoin a listener in a, then kill every process of a and b
        self.spawn(a, "listen", "7000")
        time.sleep(1)
        connect = ("connect", a.address, "7000")
        before_isolation = self.run_probe(b, *connect)
        a.isolate()
        isolated = self.run_probe(b, *connect)
        a.rejoin()
        rejoined = self.run_probe(b, *connect)
        results = [r["result"] for r in (before_isolation, isolated, rejoined)]
        figures = {"before": before_isolation, "isolated": isolated, "rejoined": rejoined}
        self.expect(results == ["ok", "timeout", "ok"], "connect from b to a", figures)
        a.spawn("shell", ["sh", "-c", "sleep 1000 & sleep 1000 & wait"], self.env)
        while len(a.pids()) < 4:  # the listener, the shell and its two children
            time.sleep(0.02)
        pids = a.pids() + b.pids()
        a.freeze()  # kill() must also end a frozen host
        a.kill()
        b.kill()
        gone = not any(_running(pid) for pid in pids)
        left = {"killed": len(pids), "left": a.pids() + b.pids()}
        self.expect(gone and not left["left"], "kill(): every process gone", left)
        # 6. restarts keep data
        with psycopg2.connect(s.database_url) as conn, conn.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS fleet_check (id int)")
            cursor.execute("INSERT INTO fleet_check VALUES (42)")
        redis.Redis.from_url(s.redis_url).set("fleet_check", "42")
        times = {}
        for what, restart in (("postgres", s.restart_postgres), ("redis", s.restart_redis)):
            started = time.monotonic()
            restart(0.5)
            times[what] = round(time.monotonic() - started, 2)
        with psycopg2.connect(s.database_url) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM fleet_check WHERE id = 42")
            rows = cursor.fetchone()
        kept = redis.Redis.from_url(s.redis_url).get("fleet_check")
        figures = {"seconds": times, "pg rows": rows, "redis": kept}
        self.expect(rows == (1,) and kept == b"42", "restarts (0.5 s down) keep data", figures)

    def close(self) -> None:
        """7. nothing of the fleet left behind"""
        self.servers.stop()
        self.fleet.close()
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        controllers = ("cpu", "cpuacct", "freezer")
        cgroups = [c for c in controllers if Path(f"/sys/fs/cgroup/{c}/{PREFIX}").exists()]
        left = {
            "netns": [n for n in netns.split() if n.startswith(PREFIX)],
            "links": [line.split(":")[1].strip() for line in links.splitlines() if PREFIX in line],
            "cgroups": cgroups,
        }
        self.expect(not any(left.values()), "close(): nothing left", left)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, help="folder for logs and data (default: a temp one)")
    args = parser.parse_args()
    os.chdir(REPO)  # host.run's probes run as `python -m tests.fleet.probes` from here
    root = (args.root or Path(tempfile.mkdtemp(prefix="fleet-selfcheck-"))).resolve()
    print(f"fleet selfcheck under {root}", flush=True)
    check = Check(root)
    try:
        check.all()
    finally:
        check.close()
    if check.failures:
        sys.exit(f"{len(check.failures)} check(s) failed: {', '.join(check.failures)}")
    print("all checks passed")


if __name__ == "__main__":
    main()
