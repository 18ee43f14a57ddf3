"""`Client`: the service's HTTP API from Python, over `requests`.

Calls that wait (long-polls, event streams, following a batch) ride out what a
waiting client meets: 429 and 503 (no sooner than their Retry-After), 502 and
504 from a proxy, and dropped connections, with exponential backoff and jitter;
an event stream resumes after the last event it received (Last-Event-ID), so
nothing is missed or repeated. Every other call makes one request: any answer
outside 2xx raises `ApiError`, a network failure raises `requests`' own error.
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from os import PathLike, fspath
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import requests

from inference_client import progress as bars
from inference_client import tensors
from inference_client.errors import ApiError, WaitTimeout
from inference_client.resources import (
    Batch,
    BatchResults,
    Event,
    Job,
    ResultRow,
    UploadedFile,
)
from inference_client.streams import chunks, jsonl, sse

__all__ = ["Client"]

log = logging.getLogger("inference_client")

LONG_POLL_S = 30  # the service answers a long-poll after at most 30 s
STREAM_READ_S = (
    45.0  # an event stream sends a keepalive every 15 s: silence past this is a dead link
)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
METADATA_TTL_S = 60.0
BULK_MAX = 1000  # jobs the service takes in one POST /jobs/bulk
BACKOFF_FIRST_S = 0.5
# The service's address and a tenant's key, when `Client()` is not given them.
URL_VARIABLE, KEY_VARIABLE = "INFERENCE_URL", "INFERENCE_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
NPY, JSONL = "application/x-npy", "application/jsonl"
RESULT_TYPES = {".npy": NPY, ".jsonl": JSONL, ".parquet": "application/vnd.apache.parquet"}

if TYPE_CHECKING:
    import numpy.typing as npt

    # What `upload` and `batch` take: a file path, the bytes of a file, a numpy
    # array, rows (a list), a pandas DataFrame (typed Any: pandas has no type
    # hints), or (batch only) inline inputs `{"<input>": rows}`.
    Source = (
        str | PathLike[str] | bytes | Sequence[Any] | Mapping[str, Any] | npt.NDArray[Any] | Any
    )


class _Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def cap(self, seconds: float) -> float:
        left = self.left()
        return seconds if left is None else min(seconds, left)


class _Retry:
    """Exponential backoff with jitter between tries of one waiting call; a
    server's Retry-After is honoured as given."""

    def __init__(self, cap_s: float, what: str) -> None:
        self.cap_s, self.what, self.attempt = cap_s, what, 0

    def reset(self) -> None:
        self.attempt = 0

    def pause(self, exc: Exception, deadline: _Deadline, last: Job | Batch | None) -> None:
        """Sleep before the next try, or re-raise `exc` when it is not worth
        retrying; WaitTimeout when the next try would come past the deadline."""
        if isinstance(exc, ApiError):
            if exc.status not in RETRY_STATUSES:
                raise exc
            hinted = exc.retry_after
        elif isinstance(exc, requests.ConnectionError | requests.Timeout):
            hinted = None  # ChunkedEncodingError (a cut stream) is a ConnectionError too
        else:
            raise exc
        ceiling = min(self.cap_s, BACKOFF_FIRST_S * 2**self.attempt)
        delay = hinted if hinted is not None else random.uniform(ceiling / 2, ceiling)
        self.attempt += 1
        left = deadline.left()
        if left is not None and delay >= left:
            raise WaitTimeout(f"{self.what}: gave up, the time ran out ({exc})", last) from exc
        log.warning("%s: %s; trying again in %.1f s", self.what, exc, delay)
        time.sleep(delay)


class Client:
    """One service, one API key. Not meant to be shared between threads (its
    `requests.Session` keeps connections open for the next call)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        max_backoff: float = 30.0,
    ) -> None:
        """`base_url` and `api_key` default to $INFERENCE_URL (else
        http://127.0.0.1:8000) and $INFERENCE_API_KEY, so code and the shell name
        them once; arguments given win. `timeout` bounds each request's connect
        and each read (a waiting call adds its own wait to it); `max_backoff` caps
        one pause between retries."""
        if base_url is None:
            base_url = os.environ.get(URL_VARIABLE) or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get(KEY_VARIABLE) or None
        if not api_key:
            raise ValueError(f"no API key: pass api_key or set {KEY_VARIABLE}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.session = session or requests.Session()
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": "inference-client/1"}
        self._metadata: dict[tuple[str, str | None], tuple[float, dict[str, Any]]] = {}

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        timeout: float | tuple[float, float] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> requests.Response:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        response = self.session.request(
            method, self.base_url + path, headers=headers, stream=stream,
            timeout=timeout if timeout is not None else self.timeout, **kwargs,
        )  # fmt: skip
        if not 200 <= response.status_code < 300:
            error = ApiError.from_response(response)
            response.close()
            raise error
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._request(method, path, **kwargs)
        body = response.json()
        if not isinstance(body, dict):
            raise ApiError(response.status_code, title="Unexpected answer",
                           detail="the body is not a JSON object", body=response.text)  # fmt: skip
        return body

    # -- models ----------------------------------------------------------------

    def models(self) -> builtins.list[dict[str, Any]]:
        """GET /models: the models this key may use, with inputs, outputs, labels."""
        models: builtins.list[dict[str, Any]] = self._json("GET", "/models")["models"]
        return models

    def model(self, name: str, version: str | None = None) -> dict[str, Any]:
        """KServe v2 metadata (`name`, `versions`, `inputs`, `outputs`), kept a minute."""
        key = (name, version)
        cached = self._metadata.get(key)
        if cached is not None and time.monotonic() - cached[0] < METADATA_TTL_S:
            return cached[1]
        metadata = self._json("GET", _model_path(name, version))
        self._metadata[key] = (time.monotonic(), metadata)
        return metadata

    def input_names(self, name: str, version: str | None = None) -> builtins.list[str]:
        return [str(spec["name"]) for spec in self.model(name, version).get("inputs", [])]

    def _named(self, model: str, version: str | None, inputs: Any) -> dict[str, Any]:
        """`{"<input>": value}` from a mapping, or from a bare array or nested list
        for a model with one input (named from its metadata)."""
        if isinstance(inputs, Mapping):
            return {str(name): value for name, value in inputs.items()}
        names = self.input_names(model, version)
        if len(names) != 1:
            raise ValueError(
                f"model {model} has inputs {', '.join(names)}: pass a mapping "
                "{input name: value} instead of one array"
            )
        return {names[0]: inputs}

    # -- jobs ------------------------------------------------------------------

    def submit(
        self,
        model: str,
        inputs: Any,
        *,
        version: str | None = None,
        webhook: str | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        cancel_after: float | None = None,
        deadline: datetime | None = None,
        priority: int | None = None,
        wait: float | None = None,
    ) -> Job:
        """POST /jobs. `inputs`: `{"<input>": array or nested list}`, a list of
        KServe v2 tensors `[{"name", "shape", "datatype", "data"}]`, or one array
        for a model with one input. `webhook`: a URL, or `{"url", "events"}`.
        `cancel_after` (seconds) or `deadline`: the job expires unfinished then.
        `priority`: 0-9, higher first among the model's queued jobs (the service's
        default when None; past the tenant's allowance a 422).
        `wait` (seconds): the service holds the answer until the job finishes or
        the time is up (`Prefer: wait`); the job is returned as it stands then."""
        body: dict[str, Any] = {"model": model, "inputs": self._job_inputs(model, version, inputs)}
        if version is not None:
            body["version"] = version
        if webhook is not None:
            body["webhook"] = {"url": webhook} if isinstance(webhook, str) else dict(webhook)
        if deadline is not None:
            if deadline.tzinfo is None:
                raise ValueError("deadline needs a time zone (datetime.now(UTC) + ...)")
            body["deadline"] = deadline.isoformat()
        if priority is not None:
            body["priority"] = priority
        headers: dict[str, str] = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if cancel_after is not None:
            headers["Cancel-After"] = repr(float(cancel_after))
        if wait is not None:
            headers["Prefer"] = f"wait={math.ceil(wait)}"
        timeout = self.timeout + (math.ceil(wait) if wait is not None else 0)
        return Job.from_json(
            self._json("POST", "/jobs", json=body, headers=headers, timeout=timeout)
        )

    def submit_many(
        self,
        model: str,
        inputs: Iterable[Any],
        *,
        version: str | None = None,
        priority: int | None = None,
        idempotency_keys: Iterable[str] | None = None,
        per_request: int = BULK_MAX,
        on_bulk: Callable[[int], object] | None = None,
    ) -> builtins.list[Job | ApiError]:
        """POST /jobs/bulk: a job for each of `inputs` (each as `submit` takes it),
        in bulks of up to `per_request` (the service takes 1,000). Returns, in order,
        each input's Job, or the ApiError that refused that input alone (a bad input
        never refuses the others; its problem's `index` is the input's place).
        `idempotency_keys`, one per input, make a retry of the whole call safe: each
        input's job is made once. `on_bulk` is called with each bulk's size once it
        was answered (a progress bar's update)."""
        items: builtins.list[dict[str, Any]] = []
        keys = iter(idempotency_keys) if idempotency_keys is not None else None
        for each in inputs:
            item: dict[str, Any] = {"model": model,
                                    "inputs": self._job_inputs(model, version, each)}  # fmt: skip
            if version is not None:
                item["version"] = version
            if priority is not None:
                item["priority"] = priority
            if keys is not None:
                item["idempotency_key"] = next(keys, None)
                if item["idempotency_key"] is None:
                    raise ValueError("give one idempotency key for each input")
            items.append(item)
        outcomes: builtins.list[Job | ApiError] = []
        url = self.base_url + "/jobs/bulk"
        step = max(1, min(per_request, BULK_MAX))
        for start in range(0, len(items), step):
            body = self._json("POST", "/jobs/bulk", json={"jobs": items[start : start + step]})
            for answer in body["jobs"]:
                is_problem = isinstance(answer.get("status"), int)
                if is_problem and isinstance(answer.get("index"), int):
                    answer["index"] += start  # the input's place, not its place in this bulk
                outcomes.append(ApiError.from_problem(answer, method="POST", url=url)
                                if is_problem else Job.from_json(answer))  # fmt: skip
            if on_bulk is not None:
                on_bulk(len(body["jobs"]))
        return outcomes

    def _job_inputs(self, model: str, version: str | None, inputs: Any) -> Any:
        if _is_v2_tensors(inputs):
            return [_v2_tensor(tensor) for tensor in inputs]
        return tensors.jsonable(self._named(model, version, inputs))

    def get(self, job_id: str) -> Job:
        """GET /jobs/<id>."""
        return Job.from_json(self._json("GET", f"/jobs/{quote(job_id)}"))

    def wait(
        self, job_id: str, timeout: float | None = None, *, via: Literal["poll", "sse"] = "poll"
    ) -> Job:
        """The job once finished (succeeded, failed, cancelled or expired). `via`
        "poll" long-polls GET /jobs/<id>?wait=30; "sse" follows its event stream.
        WaitTimeout (with the job as last read) after `timeout` seconds; None
        waits as long as it takes."""
        if via == "sse":
            last: Event | None = None
            for event in self.events(job_id, timeout=timeout):
                last = event
            finished = last.job if last is not None else None
            return finished if finished is not None else self.get(job_id)  # 204: all was sent
        if via != "poll":
            raise ValueError(f"via must be 'poll' or 'sse', not {via!r}")
        deadline = _Deadline(timeout)
        retry = _Retry(self.max_backoff, f"waiting for job {job_id}")
        job: Job | None = None
        while True:
            seconds = round(deadline.cap(LONG_POLL_S), 3)
            try:
                params = {"wait": seconds} if seconds > 0 else {}
                job = Job.from_json(
                    self._json("GET", f"/jobs/{quote(job_id)}", params=params,
                               timeout=self.timeout + seconds)
                )  # fmt: skip
            except (ApiError, requests.RequestException) as exc:
                retry.pause(exc, deadline, job)
                continue
            retry.reset()
            if job.finished:
                return job
            if deadline.expired:
                raise WaitTimeout(f"job {job_id} is still {job.status}", job)

    def events(
        self, job_id: str, *, last_event_id: int | None = None, timeout: float | None = None
    ) -> Iterator[Event]:
        """The job's events (GET /jobs/<id>/events) as they happen, after
        `last_event_id` if given, until the terminal one (whose `job` is the
        finished job). A dropped stream is resumed after the last event
        received, so none is missed or repeated."""
        deadline = _Deadline(timeout)
        retry = _Retry(self.max_backoff, f"events of job {job_id}")
        after = last_event_id
        while True:
            if deadline.expired:
                raise WaitTimeout(f"job {job_id} did not finish in time")
            try:
                headers = {"Accept": "text/event-stream"}
                if after is not None:
                    headers["Last-Event-ID"] = str(after)
                read_s = max(deadline.cap(STREAM_READ_S), 0.5)
                opened = time.monotonic()
                response = self._request(
                    "GET", f"/jobs/{quote(job_id)}/events", headers=headers, stream=True,
                    timeout=(self.timeout, read_s),
                )  # fmt: skip
                if response.status_code == 204:  # every event was sent already
                    response.close()
                    return
                received = 0
                with response:
                    for raw in sse(chunks(response)):
                        received += 1
                        event = Event(
                            int(raw.id) if raw.id and raw.id.isdigit() else None,
                            raw.type,
                            json.loads(raw.data) if raw.data else {},
                        )
                        retry.reset()
                        if event.id is not None:
                            after = event.id
                        yield event
                        if event.terminal:
                            return
                # The stream ended without its terminal event (the service ends
                # streams after 10 minutes; a proxy may end them sooner): resume at
                # once, unless it ended at once with nothing, which is backed off.
                if received == 0 and time.monotonic() - opened < 1.0:
                    raise requests.ConnectionError("the event stream ended without an event")
                log.info("events of job %s: stream ended; resuming after %s", job_id, after)
            except (ApiError, requests.RequestException) as exc:
                retry.pause(exc, deadline, None)

    def cancel(self, job_id: str) -> Job:
        """POST /jobs/<id>/cancel: a queued job ends cancelled at once, a running
        one before its result is written (`cancel_requested_at` set). 409 once
        finished."""
        return Job.from_json(self._json("POST", f"/jobs/{quote(job_id)}/cancel"))

    # -- sync inference --------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Any,
        *,
        version: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """POST /v2/models/<model>/infer (KServe v2 JSON): the outputs by name, as
        numpy arrays of their datatypes (nested lists without numpy). `inputs` as
        for `submit`; datatypes come from the model's metadata. `timeout`
        (seconds): the service's deadline for the call, past which it answers
        504 `sync-timeout` with the job's id (`ApiError.problem["job_id"]`)."""
        if _is_v2_tensors(inputs):
            body_inputs = [_v2_tensor(tensor) for tensor in inputs]
        else:
            specs = {spec["name"]: spec for spec in self.model(model, version).get("inputs", [])}
            body_inputs = []
            for name, value in self._named(model, version, inputs).items():
                datatype = specs.get(name, {}).get("datatype") or tensors.datatype_of(value)
                if datatype is None:
                    raise ValueError(f"model {model} has no input {name!r}; it has {list(specs)}")
                body_inputs.append(
                    {"name": name, "shape": tensors.shape_of(value), "datatype": datatype,
                     "data": tensors.flatten(value)}
                )  # fmt: skip
        body: dict[str, Any] = {"inputs": body_inputs}
        if timeout is not None:
            body["parameters"] = {"timeout": max(1, round(timeout * 1e6))}  # microseconds
        answer = self._json(
            "POST", _model_path(model, version) + "/infer", json=body,
            timeout=self.timeout + (timeout if timeout is not None else 60.0),
        )  # fmt: skip
        return {
            str(out["name"]): tensors.from_v2(out["datatype"], out["shape"], out.get("data", []))
            for out in answer["outputs"]
        }

    # -- batches ---------------------------------------------------------------

    def upload(
        self,
        source: Source,
        *,
        filename: str | None = None,
        columns: Mapping[str, Sequence[str]] | None = None,
        progress: bool | None = None,
    ) -> UploadedFile:
        """POST /files: a path (streamed from disk; .npy, .jsonl, .csv or
        .parquet), the bytes of a file (give `filename`, whose extension says the
        format), a numpy array (sent as .npy), a pandas DataFrame (sent as
        Parquet, a column per model input; `columns={"<input>": [column, ...]}`
        gathers several columns into one input) or rows (a list, sent as JSON
        Lines). `progress`: a byte bar on stderr; None shows it only when stderr
        is a terminal."""
        from inference_client import frames

        if isinstance(source, str | PathLike):
            path = Path(fspath(source))
            with path.open("rb") as file:
                return self._upload(file, path.stat().st_size, filename or path.name, progress)
        if isinstance(source, bytes | bytearray):
            if filename is None:
                raise ValueError("name the bytes' format: filename='rows.npy' "
                                 "(or .jsonl, .csv, .parquet)")  # fmt: skip
            return self._sent(bytes(source), filename, progress)
        if frames.is_frame(source):
            return self._sent(frames.to_parquet(source, columns), filename or "frame.parquet",
                              progress)  # fmt: skip
        if columns is not None:
            raise TypeError("columns= gathers a DataFrame's columns: give a DataFrame")
        if tensors.is_array(source):
            return self._sent(tensors.to_npy(source), filename or "rows.npy", progress)
        if isinstance(source, Sequence):
            lines = "".join(json.dumps(tensors.jsonable(row)) + "\n" for row in source)
            return self._sent(lines.encode(), filename or "rows.jsonl", progress)
        raise TypeError(f"cannot upload a {type(source).__name__}: give a path, bytes, an array, "
                        "a DataFrame or a list of rows")  # fmt: skip

    def _sent(self, data: bytes, filename: str, progress: bool | None) -> UploadedFile:
        return self._upload(io.BytesIO(data), len(data), filename, progress)

    def _upload(
        self, file: IO[bytes], size: int, filename: str, progress: bool | None
    ) -> UploadedFile:
        with bars.bar(progress, total=size, desc=f"upload {filename}", unit="B",
                      unit_scale=True, unit_divisor=1024) as shown:  # fmt: skip
            return UploadedFile.from_json(
                self._json(
                    "POST", "/files", params={"filename": filename},
                    data=bars.CountingReader(file, size, shown),
                    headers={"Content-Type": "application/octet-stream"},
                )
            )  # fmt: skip

    def create_batch(
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
        return Batch.from_json(self._json("POST", "/batches", json=body))

    def get_batch(self, batch_id: str) -> Batch:
        return Batch.from_json(self._json("GET", f"/batches/{quote(batch_id)}"))

    def cancel_batch(self, batch_id: str) -> Batch:
        return Batch.from_json(self._json("POST", f"/batches/{quote(batch_id)}/cancel"))

    def follow_batch(
        self, batch_id: str, *, interval: float = 1.0, timeout: float | None = None
    ) -> Iterator[Batch]:
        """The batch's progress every `interval` seconds, until it finished (the
        last one yielded). WaitTimeout after `timeout` seconds."""
        deadline = _Deadline(timeout)
        retry = _Retry(self.max_backoff, f"following batch {batch_id}")
        batch: Batch | None = None
        while True:
            try:
                batch = self.get_batch(batch_id)
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

    def batch_results(self, batch_id: str) -> Iterator[ResultRow]:
        """A finished batch's rows in input order, streamed (JSON Lines): each
        with its outputs, or the error of its chunk. 409 while it runs."""
        response = self._request(
            "GET", f"/batches/{quote(batch_id)}/results", stream=True,
            headers={"Accept": JSONL},
        )  # fmt: skip
        return _rows(response)

    def batch_array(self, batch_id: str, *, output: str | None = None) -> Any:
        """A finished batch's outputs as one numpy array (needs numpy): the output
        named, or a structured array with a field per output. 409 when a row failed."""
        response = self._request(
            "GET", f"/batches/{quote(batch_id)}/results",
            params={"output": output} if output else None,
            headers={"Accept": NPY},
        )  # fmt: skip
        return tensors.from_npy(response.content)

    def batch_frame(self, batch_id: str, *, index: Any = None) -> Any:
        """A finished batch's results as a pandas DataFrame (the `parquet`
        extra), a row per input row in input order (or `index`, e.g. the input
        frame's), a column per output; a vector output holds a numpy array per
        row. Read as Parquet; where some rows failed, from JSON Lines instead,
        with their outputs missing and `error` (the code) and `error_message`
        columns added. 409 while it runs."""
        from inference_client import frames

        frames.modules()  # the ImportError that says what to install, before any request
        try:
            response = self._request("GET", f"/batches/{quote(batch_id)}/results",
                                     headers={"Accept": frames.PARQUET})  # fmt: skip
            frame = frames.from_parquet(response.content)
        except ApiError as exc:
            # 409: rows without outputs, which Parquet cannot leave out; 422: outputs
            # it cannot hold (text). JSON Lines has every row (or says 409 itself).
            if exc.status not in (409, 422):
                raise
            batch = self.get_batch(batch_id)
            outputs = self.model(batch.model, batch.model_version).get("outputs", [])
            frame = frames.from_rows(self.batch_results(batch_id), outputs)
        if index is not None:
            frame.index = index
        return frame

    def download_batch_results(
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
        response = self._request(
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

    def batch(
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
        """Run a batch to its end: upload `source` (see `upload`: a path, bytes,
        an array, a pandas DataFrame, rows; a mapping `{"<input>": rows}` goes
        inline instead), create the batch, follow it (`on_progress` gets each
        snapshot) and return its results: its rows in input order as they are
        iterated, or `.to_pandas()` (indexed like a DataFrame source). `.batch`
        is the finished batch. `progress`: bars on stderr for the upload's bytes
        and the rows finished; None shows them only when stderr is a terminal."""
        from inference_client import frames

        if isinstance(source, Mapping):
            created = self.create_batch(model, inputs=source, version=version, webhook=webhook)
        else:
            file = self.upload(source, columns=columns, progress=progress)
            created = self.create_batch(model, file_id=file.id, version=version, webhook=webhook)
        finished = created
        rows = bars.RowsBar(progress, created.id)
        try:
            for finished in self.follow_batch(created.id, interval=interval, timeout=timeout):
                rows.show(finished)
                if on_progress is not None:
                    on_progress(finished)
        finally:
            rows.close()
        index = source.index if frames.is_frame(source) else None
        return BatchResults(finished, client=self, index=index)

    # Last: inside the class body, `list` names this method from here on.
    def list(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        page_size: int = 50,
        include_outputs: bool = False,
    ) -> Iterator[Job]:
        """The tenant's jobs, newest first, following `next_cursor` page after
        page (of `page_size`, at most 200) as they are iterated."""
        params: dict[str, Any] = {"limit": page_size}
        if status is not None:
            params["status"] = status
        if model is not None:
            params["model"] = model
        if include_outputs:
            params["include"] = "outputs"
        while True:
            page = self._json("GET", "/jobs", params=params)
            for item in page.get("items", []):
                yield Job.from_json(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return
            params["cursor"] = cursor


def _model_path(name: str, version: str | None) -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version is not None else "")


def _is_v2_tensors(inputs: Any) -> bool:
    return (
        isinstance(inputs, Sequence)
        and not isinstance(inputs, str | bytes)
        and bool(inputs)
        and all(isinstance(t, Mapping) and "datatype" in t and "name" in t for t in inputs)
    )


def _v2_tensor(tensor: Mapping[str, Any]) -> dict[str, Any]:
    """A v2 tensor as JSON: array data flattened, its shape taken from it if absent."""
    out = {str(k): v for k, v in tensor.items()}
    data = out.get("data")
    if "shape" not in out:
        out["shape"] = tensors.shape_of(data)
    out["data"] = tensors.flatten(data)
    return out


def _rows(response: requests.Response) -> Iterator[ResultRow]:
    with response:
        for row in jsonl(chunks(response)):
            yield ResultRow.from_json(row)
