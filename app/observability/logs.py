"""Logging for every process: readable text (the default), or one JSON object a
line with LOG_FORMAT=json, for a log collector to index.

A JSON line has `ts`, `level`, `logger`, `message`, and when known `job_id`,
`tenant`, `model`, `request_id` (plus `exc` for a traceback, and the fields a
call passes in `extra`). The known fields come from a context variable, so
whatever code runs for a request or a job carries them without passing them
along: the API binds the request id (and the job id once there is one), a
worker task binds the model it drains and the job it delivers. `scope()`
opens a fresh context for each request and task, so one never inherits the
last one's fields on a reused thread.

A formatter of our own, not python-json-logger: the fields are few, the
context merging is ours either way, and it is about twenty lines.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

FIELDS = ("job_id", "tenant", "model", "request_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_NONE: Mapping[str, str] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "log_context", default=_NONE
)
# The attributes every LogRecord has: anything else on a record came from `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def bind(**fields: object) -> None:
    """Add fields to every line logged from here on in this context (see `scope`)."""
    _context.set({**_context.get(), **{k: str(v) for k, v in fields.items() if v is not None}})


def current() -> Mapping[str, str]:
    return _context.get()


@contextmanager
def scope(**fields: object) -> Iterator[None]:
    """A fresh context for one request or task: what it binds ends with it."""
    token = _context.set({k: str(v) for k, v in fields.items() if v is not None})
    try:
        yield
    finally:
        _context.reset(token)


def enter(**fields: object) -> contextvars.Token[Mapping[str, str]]:
    """Open a fresh context that `leave` closes: `scope` for hooks that open and
    close in two places (a request's before and teardown)."""
    return _context.set({k: str(v) for k, v in fields.items() if v is not None})


def leave(token: contextvars.Token[Mapping[str, str]]) -> None:
    with suppress(ValueError):  # set in another context (cannot happen; never fail)
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Puts the bound fields on each record (a call's own `extra` wins): in an API
    request its id and, once authenticated, its tenant; in a task its model and job."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD or key.startswith("_") or key in line or value is None:
                continue
            line[key] = value if isinstance(value, int | float | bool) else str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class _TaskChatter(logging.Filter):
    """Celery's "Task ... succeeded in ..." line (celery.app.trace, INFO) for every
    task, demoted to DEBUG: an idle service runs sweeps every second, and a job's
    own line says more. Failures and retries keep their levels."""

    def __init__(self) -> None:
        super().__init__()
        from celery.app.trace import LOG_SUCCESS

        self.success = LOG_SUCCESS

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and record.msg == self.success:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def handler(fmt: str) -> logging.Handler:
    """A stderr handler in `fmt` ("json" or "text"), with the bound fields."""
    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    out.addFilter(ContextFilter())
    out._inference = True  # type: ignore[attr-defined]
    return out


def setup(level: str | int, fmt: str, *, force: bool = False) -> None:
    """Configure the root logger once per process. Without `force` it is left
    alone when something else configured it already (as basicConfig does: pytest's
    capture, the API server's dictConfig in JSON mode); with it, it is replaced (Celery)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_inference", False)]
    if force or not root.handlers or ours:
        for old in ours if not force else list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler(fmt))
    root.setLevel(level)
    quiet_celery(root.getEffectiveLevel())
    if fmt == "json":
        logging.captureWarnings(True)  # warnings become lines like any other


def quiet_celery(level: int) -> None:
    """Per-message chatter of Celery at DEBUG, so an idle service logs nothing:
    "Received task" (celery.worker.strategy) and "Task ... succeeded"."""
    chatty = level <= logging.DEBUG
    logging.getLogger("celery.worker.strategy").setLevel(
        logging.DEBUG if chatty else logging.WARNING
    )
    trace = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, _TaskChatter) for f in trace.filters):
        trace.addFilter(_TaskChatter())


def level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    return number if isinstance(number, int) else logging.INFO


class BackgroundHandler(logging.Handler):
    """Writes its records from a thread of its own, many in one write: the thread
    that logs only queues the record, holding no lock across a write and doing no
    I/O. For the API server's access log, a line every request: its handler's lock
    and write were 6% of an API process's samples under 16 sync clients. Records
    still queued when the process exits are written at exit (one killed loses them)."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stdout
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._pid: int | None = None  # the process whose thread writes (one per fork)
        self._starting = threading.Lock()
        atexit.register(self.write_queued)

    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        if self._pid != os.getpid():
            self._start()
        self._queue.put(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self._queue.put(record)

    def write_queued(self) -> None:
        """Write what is queued now (at exit)."""
        self._write(self._take())

    def _start(self) -> None:
        with self._starting:
            if self._pid != os.getpid():
                threading.Thread(target=self._run, name="log-writer", daemon=True).start()
                self._pid = os.getpid()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            self._write([first, *self._take()])

    def _take(self) -> list[logging.LogRecord]:
        taken = []
        with suppress(queue.Empty):
            while True:
                taken.append(self._queue.get_nowait())
        return taken

    def _write(self, records: list[logging.LogRecord]) -> None:
        if not records:
            return
        try:
            self.stream.write("".join(self.format(record) + "\n" for record in records))
            self.stream.flush()
        except Exception:  # a closed stream at exit: nothing to tell it to
            self.handleError(records[-1])


def access_config() -> dict[str, Any]:
    """The API server's (granian's) logging in text mode: its own lines as granian
    writes them, its access log written from a thread of its own (BackgroundHandler)."""
    formatters = {
        "generic": {"()": "logging.Formatter", "fmt": "[%(levelname)s] %(message)s"},
        "access": {"()": "logging.Formatter", "fmt": "%(message)s"},
    }
    handlers = {
        "console": {"formatter": "generic", "class": "logging.StreamHandler",
                    "stream": "ext://sys.stdout"},
        "access": {"formatter": "access", "class": "app.observability.logs.BackgroundHandler",
                   "stream": "ext://sys.stdout"},
    }  # fmt: skip
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": formatters,
        "handlers": handlers,
        "loggers": {
            "_granian": {"handlers": ["console"], "level": "INFO", "propagate": False},
            "granian.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }


def server_config(level: str) -> dict[str, Any]:
    """The API server's (granian's) logging in JSON mode: its own lines as JSON on
    stderr like every other, its access log silenced: the API logs each request
    itself (`request_line`) with the request id, tenant and job id a server cannot
    know."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "root": {"level": level, "handlers": ["console"]},
        "loggers": {
            "_granian": {"level": "INFO", "handlers": [], "propagate": True},
            "granian.access": {"level": "WARNING", "handlers": [], "propagate": True},
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "json",
                "filters": ["context"],
            },
        },
        "formatters": {"json": {"()": "app.observability.logs.JsonFormatter"}},
        "filters": {"context": {"()": "app.observability.logs.ContextFilter"}},
    }
