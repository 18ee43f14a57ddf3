"""Progress bars (tqdm) for uploads and batches. `progress=None` shows one only
when the bar's stream (stderr) is a terminal, so logs and pipes stay clean;
True always shows it, False never."""

from __future__ import annotations

import importlib
from typing import IO, Any

from inference_client.resources import Batch

_READ = 1024 * 1024


def bar(progress: bool | None, **options: Any) -> Any:
    """A tqdm bar on stderr (tqdm is imported here: it has no type hints)."""
    tqdm = importlib.import_module("tqdm").tqdm
    return tqdm(disable=None if progress is None else not progress, **options)


class CountingReader:
    """An upload body that moves a byte bar as `requests` reads it. It has a
    length, so the upload keeps its Content-Length (not chunked)."""

    def __init__(self, file: IO[bytes], size: int, shown: Any) -> None:
        self._file, self._size, self._bar = file, size, shown

    def __len__(self) -> int:
        return self._size

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._bar.update(len(data))
        return data

    def __iter__(self) -> Any:
        while data := self.read(_READ):
            yield data


class RowsBar:
    """Rows finished (done or failed) out of the batch's rows, from each snapshot."""

    def __init__(self, progress: bool | None, batch_id: str) -> None:
        self._bar = bar(progress, desc=f"batch {batch_id[:8]}", unit=" rows")

    def show(self, batch: Batch) -> None:
        if batch.rows is not None and self._bar.total != batch.rows:
            self._bar.total = batch.rows
        finished = batch.rows_done + batch.rows_failed
        if batch.rows_failed:
            self._bar.set_postfix(failed=batch.rows_failed, refresh=False)
        self._bar.update(finished - self._bar.n)

    def close(self) -> None:
        self._bar.close()
