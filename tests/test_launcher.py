"""The launcher's supervision: restart a child that dies, give up on one that
cannot stay up, refuse a port that is taken. Real processes, no services."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import pytest

from app.cli import launcher
from app.cli.launcher import Child, Launcher, LaunchError
from app.platform.settings import Settings
from tests.support import free_port, wait_until


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
    with pytest.raises(LaunchError, match=r"broken exited 3 times .* exit code 3"):
        wait_until(subject._supervise_once, "the launcher to give up (it raises)", 30)
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
    from app.platform.settings import Settings

    plain = Settings(redis_url="unix:///run/redis.sock")
    assert plain.broker_url == "redis+socket:///run/redis.sock"
    numbered = Settings(redis_url="unix:///run/redis.sock?db=3")
    assert numbered.broker_url == "redis+socket:///run/redis.sock?virtual_host=3"
    assert Settings(redis_url="redis://h:6379/2").broker_url == "redis://h:6379/2"


def test_beats_sweeps_have_a_worker_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every queue beat sends to is served by `make run`, and none is the jobs queue."""
    from app.parts import beat_schedule

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


def test_flower_gets_a_login_kept_in_var_dir_unless_one_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subject = Launcher(Settings(var_dir=tmp_path), flower_port=5599)
    monkeypatch.setattr(subject, "_spawn", lambda child: None)
    subject.first_key = subject.first_secret = None
    subject._start_children()
    children = {child.name: child for child in subject.children}
    login = children["flower"].env["FLOWER_BASIC_AUTH"]
    user, _, password = login.partition(":")
    assert user == "admin" and len(password) >= 20
    assert password not in " ".join(children["flower"].args)  # `ps` shows arguments to all
    assert "--address=127.0.0.1" in children["flower"].args
    assert children["api"].env["FLOWER_URL"] == "http://127.0.0.1:5599"
    kept = tmp_path / "flower-password"
    assert kept.read_text().strip() == password and kept.stat().st_mode & 0o777 == 0o600
    subject._announce(True)
    banner = capsys.readouterr().out
    assert f"Flower http://127.0.0.1:5599  (user admin, password {password}" in banner
    assert "status page http://127.0.0.1:8000/" in banner

    again = Launcher(Settings(var_dir=tmp_path))
    monkeypatch.setattr(again, "_spawn", lambda child: None)
    again._start_children()
    assert again.children[-1].env["FLOWER_BASIC_AUTH"] == login  # the same after a restart

    chosen = Launcher(
        Settings(var_dir=tmp_path / "other", flower_basic_auth="ops:s3cret",
                 flower_url="https://flower.example")
    )  # fmt: skip
    monkeypatch.setattr(chosen, "_spawn", lambda child: None)
    chosen.first_key = chosen.first_secret = None
    chosen._start_children()
    assert chosen.children[-1].env == {"FLOWER_BASIC_AUTH": "ops:s3cret"}
    assert "FLOWER_URL" not in chosen.children[0].env  # the API reads FLOWER_URL itself
    assert not (tmp_path / "other" / "flower-password").exists()
    chosen._announce(True)
    banner = capsys.readouterr().out
    assert "login from FLOWER_BASIC_AUTH" in banner and "s3cret" not in banner


def test_each_process_tree_counts_its_metrics_apart_and_workers_serve_theirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """API and each Celery worker: a multi-process directory of its own under VAR_DIR
    (cleared when the child starts); WORKER_METRICS_PORT and the next two for the
    three workers; with LOG_FORMAT=json no Celery banner on stdout."""
    settings = Settings(var_dir=tmp_path, worker_metrics_port=9300, log_format="json")
    subject = Launcher(settings)
    monkeypatch.setattr(subject, "_spawn", lambda child: None)
    subject._start_children()
    children = {child.name: child for child in subject.children}
    dirs = {name: c.env.get("PROMETHEUS_MULTIPROC_DIR") for name, c in children.items()}
    counted = ("api", "grpc", "worker", "webhooks", "control")
    assert dirs == {n: str(tmp_path / "metrics" / n) if n in counted else None for n in children}
    ports = {name: c.env.get("WORKER_METRICS_PORT") for name, c in children.items()}
    assert ports == {"api": None, "grpc": None, "streams": None, "worker": "9300",
                     "webhooks": "9301", "control": "9302", "beat": None,
                     "flower": None}  # fmt: skip
    assert children["grpc"].env["GRPC_METRICS_PORT"] == "9303"  # the next one
    assert children["grpc"].args[-2:] == ["-m", "app.grpc"]
    quiet = [c for name, c in children.items() if name not in ("api", "grpc", "streams")]
    assert all("--quiet" in c.args for c in quiet)
    assert children["api"].args[1:3] == ["-m", "app.cli.api_server"]  # sets up its metrics


def test_the_grpc_door_starts_on_its_port_unless_it_is_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subject = Launcher(Settings(var_dir=tmp_path, grpc_port=8123))
    monkeypatch.setattr(subject, "_spawn", lambda child: None)
    subject.first_key = subject.first_secret = None
    subject._start_children()
    assert [c.name for c in subject.children][:2] == ["api", "grpc"]  # stopped right after the API
    subject._announce(True)
    assert "gRPC (KServe v2, tritonclient.grpc): 127.0.0.1:8123" in capsys.readouterr().out
    without = Launcher(Settings(var_dir=tmp_path, grpc_port=0))
    monkeypatch.setattr(without, "_spawn", lambda child: None)
    without._start_children()
    assert "grpc" not in [c.name for c in without.children]


def test_a_stale_metrics_file_is_gone_when_its_child_starts_again(tmp_path: Path) -> None:
    folder = tmp_path / "metrics" / "sleeper"
    folder.mkdir(parents=True)
    (folder / "counter_1.db").write_bytes(b"stale")
    child = Child("sleeper", [sys.executable, "-c", "pass"],
                  env={"PROMETHEUS_MULTIPROC_DIR": str(folder)})  # fmt: skip
    supervised(child)
    assert child.proc is not None
    child.proc.wait()
    assert list(folder.iterdir()) == []


def _taken_port_after_a_free_one() -> tuple[socket.socket, int]:
    """A listening socket on port N where N - 1 is free: the inference worker's
    port stays free so that the check reaches the webhooks worker's (N)."""
    for _ in range(50):
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port: int = taken.getsockname()[1]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port - 1))
            except OSError:
                taken.close()
                continue
        return taken, port
    raise AssertionError("no port N with N - 1 free in 50 tries")


def test_a_worker_metrics_port_in_use_is_refused_before_anything_starts() -> None:
    taken, port = _taken_port_after_a_free_one()
    with taken:
        subject = Launcher(
            Settings(worker_metrics_port=port - 1, grpc_port=0),
            port=free_port(),
            flower_port=free_port(),
        )
        with pytest.raises(LaunchError, match=rf"webhooks worker's metrics port .*:{port}"):
            subject._check_ports()


def test_the_celery_commands_start_the_service_entry_point_unless_told_another() -> None:
    """`make run` starts workers.worker; a test may start its own (the fault suite's)."""
    assert [sys.executable, "-m", "celery", "-A", "workers.worker"] == launcher.CELERY
    other = "tests.faults.worker"
    schedule = Path("schedule")
    pairs = [
        (launcher.worker_command("inference", 2, "w@%h", "-O", "fair"),
         launcher.worker_command("inference", 2, "w@%h", "-O", "fair", app=other)),
        (launcher.control_worker_command("control", "c@%h"),
         launcher.control_worker_command("control", "c@%h", app=other)),
        (launcher.beat_command(schedule, "--max-interval", "1"),
         launcher.beat_command(schedule, "--max-interval", "1", app=other)),
    ]  # fmt: skip
    for service, chosen in pairs:
        assert service[:5] == launcher.CELERY
        assert chosen[:5] == [sys.executable, "-m", "celery", "-A", other]
        assert chosen[5:] == service[5:]
