"""`client.batches`: batches over an uploaded file or inline rows, followed to
their end, their results read as rows, one numpy array, a pandas DataFrame or a
file. `follow` rides out what a waiting client meets (inference_client.waiting);
the other calls make one request each."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from os import PathLike, fspath
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import requests

from inference_client import progress as bars
from inference_client import tensors
from inference_client.errors import ApiError, WaitTimeout
from inference_client.resources import Batch, BatchResults, ResultRow
from inference_client.streams import chunks, jsonl
from inference_client.waiting import Deadline, Retry

if TYPE_CHECKING:
    from inference_client.client import Client
    from inference_client.files import Source

__all__ = ["Batches"]

NPY, JSONL = "application/x-npy", "application/jsonl"
RESULT_TYPES = {".npy": NPY, ".jsonl": JSONL, ".parquet": "application/vnd.apache.parquet"}


class Batches:
    """Batches and their results (`client.batches`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        model: str,
        *,
        file_id: str | None = None,
        inputs: Mapping[str, Any] | None = None,
        version: str | None = None,
        webhook: str | Mapping[str, Any] | None = None,
    ) -> Batch:
        """POST /batches over an uploaded file or inline `{"<input>": rows}`."""
        if (file_id is None) == (inputs is None):
            raise ValueError("give either file_id or inputs")
        body: dict[str, Any] = {"model": model}
        if file_id is not None:
            body["file_id"] = file_id
        if inputs is not None:
            body["inputs"] = tensors.jsonable(inputs)
        if version is not None:
            body["version"] = version
        if webhook is not None:
            body["webhook"] = {"url": webhook} if isinstance(webhook, str) else dict(webhook)
        return Batch.from_json(self._client._json("POST", "/batches", json=body))

    def get(self, batch_id: str) -> Batch:
        return Batch.from_json(self._client._json("GET", f"/batches/{quote(batch_id)}"))

    def cancel(self, batch_id: str) -> Batch:
        return Batch.from_json(self._client._json("POST", f"/batches/{quote(batch_id)}/cancel"))

    def follow(
        self, batch_id: str, *, interval: float = 1.0, timeout: float | None = None
    ) -> Iterator[Batch]:
        """The batch's progress every `interval` seconds, until it finished (the
        last one yielded). WaitTimeout after `timeout` seconds."""
        deadline = Deadline(timeout)
        retry = Retry(self._client.max_backoff, f"following batch {batch_id}")
        batch: Batch | None = None
        while True:
            try:
                batch = self.get(batch_id)
            except (ApiError, requests.RequestException) as exc:
                retry.pause(exc, deadline, batch)
                continue
            retry.reset()
            yield batch
            if batch.finished:
                return
            if deadline.expired:
                raise WaitTimeout(f"batch {batch_id} is still {batch.status}", batch)
            time.sleep(deadline.cap(interval))

    def results(self, batch_id: str) -> Iterator[ResultRow]:
        """A finished batch's rows in input order, streamed (JSON Lines): each
        with its outputs, or the error of its chunk. 409 while it runs."""
        response = self._client._request(
            "GET", f"/batches/{quote(batch_id)}/results", stream=True,
            headers={"Accept": JSONL},
        )  # fmt: skip
        return _rows(response)

    def array(self, batch_id: str, *, output: str | None = None) -> Any:
        """A finished batch's outputs as one numpy array (needs numpy): the output
        named, or a structured array with a field per output. 409 when a row failed."""
        response = self._client._request(
            "GET", f"/batches/{quote(batch_id)}/results",
            params={"output": output} if output else None,
            headers={"Accept": NPY},
        )  # fmt: skip
        return tensors.from_npy(response.content)

    def frame(self, batch_id: str, *, index: Any = None) -> Any:
        """A finished batch's results as a pandas DataFrame (the `parquet`
        extra), a row per input row in input order (or `index`, e.g. the input
        frame's), a column per output; a vector output holds a numpy array per
        row. Read as Parquet; where some rows failed, from JSON Lines instead,
        with their outputs missing and `error` (the code) and `error_message`
        columns added. 409 while it runs."""
        from inference_client import frames

        frames.modules()  # the ImportError that says what to install, before any request
        try:
            response = self._client._request("GET", f"/batches/{quote(batch_id)}/results",
                                             headers={"Accept": frames.PARQUET})  # fmt: skip
            frame = frames.from_parquet(response.content)
        except ApiError as exc:
            # 409: rows without outputs, which Parquet cannot leave out; 422: outputs
            # it cannot hold (text). JSON Lines has every row (or says 409 itself).
            if exc.status not in (409, 422):
                raise
            batch = self.get(batch_id)
            outputs = self._client.models.get(batch.model, batch.model_version).get("outputs", [])
            frame = frames.from_rows(self.results(batch_id), outputs)
        if index is not None:
            frame.index = index
        return frame

    def download_results(
        self, batch_id: str, path: str | PathLike[str], *, output: str | None = None
    ) -> Path:
        """A finished batch's results streamed into a file whose extension says
        the format: .parquet (a column per output), .npy or .jsonl; .parquet and
        .npy hold `output` alone if named, and need every row to have succeeded
        (else 409). The file appears only once complete."""
        target = Path(fspath(path))
        accept = RESULT_TYPES.get(target.suffix.lower())
        if accept is None:
            raise ValueError(f"name the file .parquet, .npy or .jsonl, not {target.name!r}")
        partial = target.with_name(f".{target.name}.partial")
        response = self._client._request(
            "GET", f"/batches/{quote(batch_id)}/results", stream=True,
            params={"output": output} if output else None, headers={"Accept": accept},
        )  # fmt: skip
        try:
            with response, partial.open("wb") as out:
                for part in response.iter_content(1024 * 1024):
                    out.write(part)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        return target

    def run(
        self,
        model: str,
        source: Source,
        *,
        version: str | None = None,
        webhook: str | Mapping[str, Any] | None = None,
        on_progress: Callable[[Batch], None] | None = None,
        interval: float = 1.0,
        timeout: float | None = None,
        columns: Mapping[str, Sequence[str]] | None = None,
        progress: bool | None = None,
    ) -> BatchResults:
        """Run a batch to its end: upload `source` (see `client.files.upload`: a
        path, bytes, an array, a pandas DataFrame, rows; a mapping
        `{"<input>": rows}` goes inline instead), create the batch, follow it
        (`on_progress` gets each snapshot) and return its results: its rows in
        input order as they are iterated, or `.to_pandas()` (indexed like a
        DataFrame source). `.batch` is the finished batch. `progress`: bars on
        stderr for the upload's bytes and the rows finished; None shows them only
        when stderr is a terminal."""
        from inference_client import frames

        if isinstance(source, Mapping):
            created = self.create(model, inputs=source, version=version, webhook=webhook)
        else:
            file = self._client.files.upload(source, columns=columns, progress=progress)
            created = self.create(model, file_id=file.id, version=version, webhook=webhook)
        finished = created
        rows = bars.RowsBar(progress, created.id)
        try:
            for finished in self.follow(created.id, interval=interval, timeout=timeout):
                rows.show(finished)
                if on_progress is not None:
                    on_progress(finished)
        finally:
            rows.close()
        index = source.index if frames.is_frame(source) else None
        return BatchResults(finished, client=self._client, index=index)


def _rows(response: requests.Response) -> Iterator[ResultRow]:
    with response:
        for row in jsonl(chunks(response)):
            yield ResultRow.from_json(row)
