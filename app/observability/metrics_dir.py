"""Where prometheus_client keeps the metrics of a multi-process service.

The API server's processes and a Celery worker's pool children each count in
files of their own (mmap, one per process) in PROMETHEUS_MULTIPROC_DIR; the
process that answers a scrape adds them up. prometheus_client decides at its
import whether to count that way, so this module does not import it: the
API server (app.cli.api_server) and the Celery entry point call `ensure` before our metrics
are made.

One directory per process tree (the API, each Celery worker): its root (the
API server's master, Celery's main process) clears it at start, so the numbers of a
previous run are not added in. `manage.py up` gives each of its children one
under VAR_DIR/metrics; docker-compose's containers each have their own /tmp.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def current() -> Path | None:
    raw = os.environ.get(ENV)
    return Path(raw) if raw else None


def ensure(role: str) -> Path:
    """The multi-process directory, a new temporary one if none was set (removed
    when this process exits; children inherit it)."""
    path = current()
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = Path(tempfile.mkdtemp(prefix=f"inference-metrics-{role}-"))
    os.environ[ENV] = str(path)
    # Celery's command line loads Flower's plugin, which imports prometheus_client
    # before this runs: have it choose again, before any of our metrics exists.
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:  # not in forked children, which run atexit too
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


def clear(path: Path, keep_pid: int | None = None) -> None:
    """Forget the files of earlier processes (those of `keep_pid`, this process's
    own, already open, stay)."""
    path.mkdir(parents=True, exist_ok=True)
    for file in path.glob("*.db"):
        if keep_pid is None or not file.stem.endswith(f"_{keep_pid}"):
            file.unlink(missing_ok=True)
