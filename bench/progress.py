"""The benchmark's progress: one bar over its contenders on stderr (each runs for
minutes, one after another), drawn only when stderr is a terminal, so a run logged
to a file or CI reads as before. Log lines and notes are printed above the bar."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


@contextmanager
def contenders(total: int, desc: str = "bench") -> Iterator[Any]:
    """A bar of `total` contenders: `set_postfix_str` names the one running,
    `update()` counts it done; disable=None asks whether stderr is a terminal."""
    bar = tqdm(total=total, desc=desc, unit="contender", file=sys.stderr, disable=None)
    with bar, logging_redirect_tqdm() if not bar.disable else nullcontext():
        yield bar


def note(line: str) -> None:
    """A line on stdout, as print() writes it, any bar cleared first and drawn again."""
    with tqdm.external_write_mode(file=sys.stdout):
        print(line, flush=True)
