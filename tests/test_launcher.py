"""The launcher's supervision: restart a child that dies, give up on one that
cannot stay up, refuse a port that is taken. Real processes, no services."""

from __future__ import annotations

import signal
import socket
import sys
import time

import pytest

from app import launcher
from app.config import Settings
from app.launcher import Child, Launcher, LaunchError


@pytest.fixture(autouse=True)
def quick_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "RESTART_DELAY_S", 0.01)


def supervised(*children: Child) -> Launcher:
    subject = Launcher(Settings())
    subject.children = list(children)
    for child in children:
        subject._spawn(child)
    return subject


def test_a_child_that_dies_is_started_again() -> None:
    child = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    subject = supervised(child)
    assert child.proc is not None
    first = child.proc
    first.send_signal(signal.SIGKILL)
    first.wait()
    child.started_at -= 60  # it had been up a while: not a crash loop
    subject._supervise_once()
    try:
        assert child.restarts == 1 and child.proc is not first and child.proc.poll() is None
    finally:
        child.proc.kill()
        child.proc.wait()


def test_a_child_that_cannot_stay_up_stops_the_launch() -> None:
    subject = supervised(Child("broken", [sys.executable, "-c", "raise SystemExit(3)"]))
    deadline = time.monotonic() + 30
    with pytest.raises(LaunchError, match=r"broken exited 3 times .* exit code 3"):
        while time.monotonic() < deadline:
            subject._supervise_once()
            time.sleep(0.05)
    assert subject.children[0].restarts == launcher.FAST_EXIT_LIMIT - 1


def test_a_port_in_use_is_refused_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        subject = Launcher(Settings(), port=port)
        with pytest.raises(LaunchError, match=rf"127.0.0.1:{port} is not free.*PORT="):
            subject._check_ports()
    assert subject.children == []


def test_a_unix_socket_redis_url_keeps_its_database_for_celery() -> None:
    from app.config import Settings

    plain = Settings(redis_url="unix:///run/redis.sock")
    assert plain.broker_url == "redis+socket:///run/redis.sock"
    numbered = Settings(redis_url="unix:///run/redis.sock?db=3")
    assert numbered.broker_url == "redis+socket:///run/redis.sock?virtual_host=3"
    assert Settings(redis_url="redis://h:6379/2").broker_url == "redis://h:6379/2"


def test_beats_sweeps_have_a_worker_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every queue beat sends to is served by `make run`, and none is the jobs queue."""
    from workers.celery_app import beat_schedule

    subject = Launcher(Settings())
    monkeypatch.setattr(subject, "_spawn", lambda child: None)
    subject._start_children()
    served = {
        child.args[child.args.index("--queues") + 1]: child.name
        for child in subject.children
        if "--queues" in child.args
    }
    queues = {entry["options"]["queue"] for entry in beat_schedule(subject.settings).values()}
    assert queues == {subject.settings.control_queue}
    assert served[subject.settings.control_queue] == "control"
    assert subject.settings.jobs_queue not in queues
