"""`client.jobs`: submit jobs (one, or many in bulk), read, wait for (long-poll or
event stream), cancel and list them.

`wait` and `events` ride out 429 and 503 (no sooner than their Retry-After), 502
and 504 from a proxy, and dropped connections (inference_client.waiting); an
event stream resumes after the last event it received (Last-Event-ID), so
nothing is missed or repeated. The other calls make one request each.
"""

from __future__ import annotations

import builtins
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import requests

from inference_client.errors import ApiError, WaitTimeout
from inference_client.models import job_inputs
from inference_client.resources import Event, Job
from inference_client.streams import RawEvent, chunks, sse
from inference_client.waiting import Deadline, Retry, log

if TYPE_CHECKING:
    from inference_client.client import Client

__all__ = ["Jobs"]

LONG_POLL_S = 30  # the service answers a long-poll after at most 30 s
# An event stream sends a keepalive every 15 s: silence past this is a dead link.
STREAM_READ_S = 45.0
BULK_MAX = 1000  # jobs the service takes in one POST /jobs/bulk
OUTPUT = "output"  # the event of a piece of a generation's text


class Jobs:
    """The tenant's jobs (`client.jobs`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

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
        client = self._client
        body: dict[str, Any] = {
            "model": model,
            "inputs": job_inputs(client.models, model, version, inputs),
        }
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
        timeout = client.timeout + (math.ceil(wait) if wait is not None else 0)
        return Job.from_json(
            client._json("POST", "/jobs", json=body, headers=headers, timeout=timeout)
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
        client = self._client
        items: builtins.list[dict[str, Any]] = []
        keys = iter(idempotency_keys) if idempotency_keys is not None else None
        for each in inputs:
            item: dict[str, Any] = {
                "model": model,
                "inputs": job_inputs(client.models, model, version, each),
            }
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
        url = client.base_url + "/jobs/bulk"
        step = max(1, min(per_request, BULK_MAX))
        for start in range(0, len(items), step):
            body = client._json("POST", "/jobs/bulk", json={"jobs": items[start : start + step]})
            for answer in body["jobs"]:
                is_problem = isinstance(answer.get("status"), int)
                if is_problem and isinstance(answer.get("index"), int):
                    answer["index"] += start  # the input's place, not its place in this bulk
                outcomes.append(ApiError.from_problem(answer, method="POST", url=url)
                                if is_problem else Job.from_json(answer))  # fmt: skip
            if on_bulk is not None:
                on_bulk(len(body["jobs"]))
        return outcomes

    def get(self, job_id: str) -> Job:
        """GET /jobs/<id>."""
        return Job.from_json(self._client._json("GET", f"/jobs/{quote(job_id)}"))

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
        client = self._client
        deadline = Deadline(timeout)
        retry = Retry(client.max_backoff, f"waiting for job {job_id}")
        job: Job | None = None
        while True:
            seconds = round(deadline.cap(LONG_POLL_S), 3)
            try:
                params = {"wait": seconds} if seconds > 0 else {}
                job = Job.from_json(
                    client._json("GET", f"/jobs/{quote(job_id)}", params=params,
                                 timeout=client.timeout + seconds)
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
        finished job); a generation's text comes between them as `output` events
        (`Event.text`, a piece each). A dropped stream is resumed after the last
        event received, so none is missed or repeated."""
        client = self._client
        deadline = Deadline(timeout)
        retry = Retry(client.max_backoff, f"events of job {job_id}")
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
                response = client._request(
                    "GET", f"/jobs/{quote(job_id)}/events", headers=headers, stream=True,
                    timeout=(client.timeout, read_s),
                )  # fmt: skip
                if response.status_code == 204:  # every event was sent already
                    response.close()
                    return
                received = 0
                with response:
                    for raw in sse(chunks(response)):
                        received += 1
                        event = _event(raw)
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
        return Job.from_json(self._client._json("POST", f"/jobs/{quote(job_id)}/cancel"))

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
            page = self._client._json("GET", "/jobs", params=params)
            for item in page.get("items", []):
                yield Job.from_json(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return
            params["cursor"] = cursor


def _event(raw: RawEvent) -> Event:
    """A state event's data is JSON; an `output` event's is a piece of text as is."""
    event_id = int(raw.id) if raw.id and raw.id.isdigit() else None
    if raw.type == OUTPUT:
        return Event(event_id, raw.type, {}, text=raw.data)
    return Event(event_id, raw.type, json.loads(raw.data) if raw.data else {})
