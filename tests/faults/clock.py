"""A wall clock set forward (or back) for the service's own code in a fault-suite
process: FAULTS_CLOCK_SKEW_SECONDS, read by the suite's Celery entry point.

The machine's clock is not a test's to change, and nothing here can shift a
whole process's clock from outside (libfaketime is not installed). So every
module of app/ and workers/ is imported, and each one's `datetime` and `time`
names are replaced by ones whose `now()`, `utcnow()`, `today()`, `time()` and
`time_ns()` are shifted: whatever the service's code reads of the wall clock,
however it is written, is off by the skew. Monotonic clocks are not shifted (a
jumped wall clock does not move them), and neither are the clocks Celery, kombu
and the other libraries read for themselves.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import os
import pkgutil
import sys
import time as _time
import types
from typing import Any

SKEW_VARIABLE = "FAULTS_CLOCK_SKEW_SECONDS"
PACKAGES = ("app", "workers")
_REAL = _dt.datetime


def skewed_datetime(seconds: float) -> type[_dt.datetime]:
    """`datetime` whose now() is `seconds` ahead; everything it makes is a real datetime,
    and a real datetime is an instance of it (isinstance checks keep working)."""
    skew = _dt.timedelta(seconds=seconds)

    class Meta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, _REAL)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, _REAL)

    class SkewedDatetime(_REAL, metaclass=Meta):
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            return _REAL(*args, **kwargs)

        @classmethod
        def now(cls, tz: _dt.tzinfo | None = None) -> Any:
            return _REAL.now(tz) + skew

        @classmethod
        def utcnow(cls) -> Any:
            return _REAL.now(_dt.UTC).replace(tzinfo=None) + skew

        @classmethod
        def today(cls) -> Any:
            return _REAL.now() + skew

    return SkewedDatetime


def skewed_time(seconds: float) -> types.ModuleType:
    """The `time` module with time() and time_ns() `seconds` ahead."""

    class SkewedTime(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(_time, name)

    module = SkewedTime("time")
    module.time = lambda: _time.time() + seconds  # type: ignore[attr-defined]
    module.time_ns = lambda: _time.time_ns() + int(seconds * 1e9)  # type: ignore[attr-defined]
    return module


def skew_service_clock(seconds: float) -> list[str]:
    """Shift the wall clock of every module of app/ and workers/ (imported here first,
    so none comes later with the true clock); returns the modules changed."""
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    datetime_class, time_module = skewed_datetime(seconds), skewed_time(seconds)
    changed = []
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        if getattr(module, "datetime", None) is _REAL:
            module.datetime = datetime_class  # type: ignore[attr-defined]
            changed.append(name)
        if getattr(module, "time", None) is _time:
            module.time = time_module  # type: ignore[attr-defined]
            changed.append(name)
    return sorted(set(changed))


def skew_from_env() -> None:
    seconds = float(os.environ.get(SKEW_VARIABLE) or 0)
    if seconds:
        changed = skew_service_clock(seconds)
        print(f"wall clock {seconds:+g} s in {len(changed)} modules", flush=True)
