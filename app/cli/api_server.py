"""`python -m app.cli.api_server`: the API under granian, a Rust HTTP server.

Why granian rather than gunicorn's gthread workers: on two cores, with the same
2 processes x 32 threads, it took 20-25% less CPU per request (the HTTP parsing
and the connection handling gunicorn does in Python) and served 15-30% more
async submits and inline sync calls (README, Performance). Flask and the WSGI
app are the same; requests still run on blocking threads, so slow clients and
open event streams hold a thread, not a process, as before.

Before a worker starts: the multi-process metrics directory (PROMETHEUS_MULTIPROC_DIR)
is made and cleared, so the workers count into it from their first request;
with LOG_FORMAT=json the server's own lines are JSON too and its access log is
off (the API logs each request itself, with its request id, tenant and job);
in text mode its access log is written from a thread of its own, off the
requests' threads (app.observability.logs.BackgroundHandler).
"""

from __future__ import annotations

import argparse
from typing import Any

from granian.log import LogLevels

from app.observability import logs, metrics_dir
from app.platform.settings import Settings

TARGET = "app:create_app"
KILL_TIMEOUT_S = 10  # a worker still busy this long after a stop is killed
ACCESS_FORMAT = '%(addr)s - "%(method)s %(path)s %(protocol)s" %(status)d %(dt_ms).3f ms'


def options(bind: str, workers: int, threads: int, settings: Settings) -> dict[str, Any]:
    """granian's settings for the API (also what the tests check)."""
    host, _, port = bind.rpartition(":")
    json_logs = settings.log_format == "json"
    return {
        "target": TARGET,
        "factory": True,
        "address": host or "127.0.0.1",
        "port": int(port),
        "workers": workers,
        "blocking_threads": threads,
        "respawn_failed_workers": True,  # a worker that died is started again
        "workers_kill_timeout": KILL_TIMEOUT_S,
        "log_level": LogLevels(settings.log_level.lower()),
        "log_dictconfig": (
            logs.server_config(settings.log_level) if json_logs else logs.access_config()
        ),
        "log_access": not json_logs,
        "log_access_format": ACCESS_FORMAT,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.cli.api_server", description=__doc__)
    parser.add_argument("--bind", default="127.0.0.1:8000", help="host:port")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--threads", type=int, default=32, help="request threads a process")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    metrics_dir.clear(metrics_dir.ensure("api"))
    from granian import Granian
    from granian.constants import Interfaces

    Granian(
        interface=Interfaces.WSGI, **options(args.bind, args.workers, args.threads, settings)
    ).serve()


if __name__ == "__main__":
    main()
