"""Progress bars for long work run from a terminal (`models build`, `manage.py
submit`, the benchmark): one tqdm bar on stderr, drawn only when stderr is a
terminal, so stdout stays machine-readable and a run logged to a file or CI reads
as before. Log lines and printed lines go above the bar, not through it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any


@contextmanager
def bar(total: int, desc: str, unit: str, *, at_least: int = 1) -> Iterator[Any]:
    """A bar of `total` steps; none for fewer than `at_least` (nothing worth
    following). tqdm's disable=None asks whether stderr is a terminal."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    quiet = None if total >= at_least else True
    shown = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=quiet)
    with shown, logging_redirect_tqdm() if not shown.disable else nullcontext():
        yield shown


def echo(line: str) -> None:
    """A line on stdout, any bar on the terminal cleared first and drawn again."""
    from tqdm import tqdm

    with tqdm.external_write_mode(file=sys.stdout):
        print(line, flush=True)
