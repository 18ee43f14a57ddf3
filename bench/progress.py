"""The benchmark's progress: one bar over its contenders (each runs for minutes, one
after another), as app.observability.progress draws bars: on stderr, only when it is
a terminal, log lines and notes printed above it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.observability import progress


@contextmanager
def contenders(total: int, desc: str = "bench") -> Iterator[Any]:
    """A bar of `total` contenders: `set_postfix_str` names the one running,
    `update()` counts it done."""
    with progress.bar(total, desc, "contender", at_least=0) as bar:
        yield bar


note = progress.echo
