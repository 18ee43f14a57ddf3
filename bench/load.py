"""The load generator: raw `http.client` keep-alive connections, one per thread.

Client and service share two cores, so every microsecond the client spends is
taken from the service: no `requests` (about 1 ms of CPU per POST here), bodies
encoded once before the clock starts, and the client's own CPU per request is
measured and reported. Three shapes:

- closed loop: C threads submit N jobs in total, each as soon as its last answer came;
- open loop: a fixed Poisson arrival rate (a `Schedule`); latency counts from
  the *scheduled* send time, so a slow answer that delays the next send is
  charged to the service (no coordinated omission);
- burst: C threads as fast as they can for T seconds.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.stats import percentile, rounded

REFUSED = (429, 503)


@dataclass(frozen=True)
class Endpoint:
    """Where and how to submit: POST `path` with `headers`; the job's id is `id_field`
    in the JSON answer, or, for a bulk endpoint, in each item of its list `many`
    (items without one are jobs refused one by one)."""

    port: int
    path: str
    id_field: str = "id"
    headers: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    many: str | None = None


@dataclass
class LoadResult:
    sent: int = 0  # requests
    accepted: int = 0  # jobs: requests answered 2xx, or a bulk answer's items with an id
    items_refused: int = 0  # a bulk answer's items without an id (problems)
    refused: int = 0
    refused_with_retry_after: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)  # accepted requests only
    # When each of those was sent (perf_counter; the scheduled time in an open loop),
    # and when each request not answered 2xx was: for latency over time (the soak).
    sent_at: list[float] = field(default_factory=list)
    unanswered_at: list[float] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    first_send: float = 0.0  # epoch seconds
    last_answer: float = 0.0  # epoch seconds
    client_cpu_s: float = 0.0

    def merge(self, other: LoadResult) -> None:
        self.sent += other.sent
        self.accepted += other.accepted
        self.items_refused += other.items_refused
        self.refused += other.refused
        self.refused_with_retry_after += other.refused_with_retry_after
        self.errors += other.errors
        self.error_samples.extend(other.error_samples[: max(0, 5 - len(self.error_samples))])
        self.latencies_ms.extend(other.latencies_ms)
        self.sent_at.extend(other.sent_at)
        self.unanswered_at.extend(other.unanswered_at)
        self.ids.extend(other.ids)

    def answered(self, started: float, latency_ms: float | None = None) -> None:
        """An accepted answer to a request sent at `started` (perf_counter), which
        took `latency_ms` (default: until now)."""
        if latency_ms is None:
            latency_ms = (time.perf_counter() - started) * 1000
        self.latencies_ms.append(latency_ms)
        self.sent_at.append(started)

    def failed(self, started: float, sample: str, refused: bool = False) -> None:
        """A request sent at `started` answered with an error (or a refusal)."""
        if refused:
            self.refused += 1
        else:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(sample[:200])
        self.unanswered_at.append(started)

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "sent": self.sent,
            "accepted": self.accepted,
            **({"items_refused": self.items_refused} if self.items_refused else {}),
            "refused": self.refused,
            "refused_with_retry_after": self.refused_with_retry_after,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "post_ms": {
                "p50": rounded(percentile(lat, 0.50), 2),
                "p99": rounded(percentile(lat, 0.99), 2),
                "max": rounded(max(lat) if lat else None, 2),
            },
            "client_cpu_ms_per_request": rounded(
                1000 * self.client_cpu_s / self.sent if self.sent else None, 3
            ),
        }


class _Client:
    """One keep-alive connection; reconnects after any transport error."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/json", **endpoint.headers}
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, tally: LoadResult, started: float) -> None:
        """Send one job and record the answer; latency counts from `started`
        (perf_counter), which is the scheduled time in an open loop."""
        tally.sent += 1
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(
                    self.endpoint.host, self.endpoint.port, timeout=60
                )
            self.conn.request("POST", self.endpoint.path, body, self.headers)
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            tally.failed(started, f"{type(exc).__name__}: {exc}")
            self.close()
            return
        if 200 <= response.status < 300:
            tally.answered(started)
            self._count(json.loads(data), tally)
        elif response.status in REFUSED:
            tally.failed(started, "", refused=True)
            if response.getheader("Retry-After") is not None:
                tally.refused_with_retry_after += 1
        else:
            tally.failed(started, f"{response.status}: {data[:200]!r}")
        if response.getheader("Connection", "").lower() == "close":
            self.close()

    def _count(self, answer: Any, tally: LoadResult) -> None:
        key, many = self.endpoint.id_field, self.endpoint.many
        if many is None:
            tally.accepted += 1
            tally.ids.append(str(answer[key]))
            return
        ids = [str(item[key]) for item in answer[many] if isinstance(item, dict) and key in item]
        tally.accepted += len(ids)
        tally.items_refused += len(answer[many]) - len(ids)
        tally.ids.extend(ids)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# A thread's next piece of work: (body, perf_counter time to send at or None), or
# None when there is no more.
NextWork = Callable[[], tuple[bytes, float | None] | None]


def _drive(endpoint: Endpoint, threads: int, next_work: NextWork) -> LoadResult:
    def client(tally: LoadResult, first_send: list[float]) -> None:
        http = _Client(endpoint)
        try:
            while (work := next_work()) is not None:
                body, at = work
                if at is not None:
                    sleep_until(at)
                if not first_send:
                    first_send.append(time.time())
                http.post(body, tally, at if at is not None else time.perf_counter())
        finally:
            http.close()

    return run_clients(threads, client)


# One client thread's loop: it counts into its own tally, and notes the time of the
# first send (of any client) in the shared list.
ClientLoop = Callable[[LoadResult, list[float]], None]


def run_clients(clients: int, client: ClientLoop) -> LoadResult:
    """`clients` threads each running `client` to the end; their tallies merged, the
    first send and last answer times and this process's CPU for all of them."""
    total = LoadResult()
    lock = threading.Lock()
    first_send: list[float] = []

    def worker() -> None:
        tally = LoadResult()
        try:
            client(tally, first_send)
        finally:
            with lock:
                total.merge(tally)

    cpu_start = time.process_time()
    pool = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    started = time.time()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    total.last_answer = time.time()
    total.client_cpu_s = time.process_time() - cpu_start
    total.first_send = min(first_send) if first_send else started
    return total


def closed_loop(endpoint: Endpoint, bodies: Sequence[bytes], jobs: int, clients: int) -> LoadResult:
    counter = itertools.count()  # next() on a count is atomic under the GIL

    def next_work() -> tuple[bytes, float | None] | None:
        i = next(counter)
        return (bodies[i % len(bodies)], None) if i < jobs else None

    return _drive(endpoint, clients, next_work)


@dataclass(frozen=True)
class Schedule:
    """Open-loop send times: `offsets` seconds after `start` (perf_counter)."""

    start: float
    offsets: Sequence[float]

    @classmethod
    def poisson(
        cls, rate: float, seconds: float, seed: int = 0, start: float | None = None
    ) -> Schedule:
        """Poisson arrivals at `rate`/s for `seconds`, from `start` (default: 50 ms
        from now, time for the clients to start)."""
        rng = random.Random(seed)
        offsets, t = [], 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            offsets.append(t)
        return cls(time.perf_counter() + 0.05 if start is None else start, offsets)

    def slots(self) -> Callable[[], tuple[int, float] | None]:
        """A thread-safe source of (index, send time), None once all are taken."""
        counter = itertools.count()  # next() on a count is atomic under the GIL

        def take() -> tuple[int, float] | None:
            i = next(counter)
            return (i, self.start + self.offsets[i]) if i < len(self.offsets) else None

        return take


def sleep_until(at: float) -> None:
    """Sleep until perf_counter time `at` (at once if it has passed)."""
    delay = at - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def open_loop(
    endpoint: Endpoint, bodies: Sequence[bytes], schedule: Schedule, clients: int
) -> LoadResult:
    """One request at each time of `schedule`; `clients` threads must exceed
    rate x latency, or sends start late (and that lateness is counted)."""
    take = schedule.slots()

    def next_work() -> tuple[bytes, float | None] | None:
        slot = take()
        return None if slot is None else (bodies[slot[0] % len(bodies)], slot[1])

    return _drive(endpoint, clients, next_work)


def burst(endpoint: Endpoint, bodies: Sequence[bytes], seconds: float, clients: int) -> LoadResult:
    counter = itertools.count()
    deadline = time.perf_counter() + seconds

    def next_work() -> tuple[bytes, float | None] | None:
        i = next(counter)
        return (bodies[i % len(bodies)], None) if time.perf_counter() < deadline else None

    return _drive(endpoint, clients, next_work)


def infer_bodies(rows: Sequence[Sequence[float]]) -> list[bytes]:
    """KServe v2 infer requests of one row each; the `id` comes back in the answer."""
    return [
        json.dumps(
            {
                "id": str(i),
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [1, len(row)],
                        "datatype": "FP32",
                        "data": list(map(float, row)),
                    }
                ],
            }
        ).encode()
        for i, row in enumerate(rows)
    ]


def bulk_bodies(jobs: Sequence[bytes], per_bulk: int) -> list[bytes]:
    """`POST /jobs/bulk` bodies, `{"jobs": [...]}`, of `per_bulk` of these job
    requests each (taken in turn, round the list as often as needed)."""
    count = max(1, len(jobs) // per_bulk)
    items = [jobs[i % len(jobs)] for i in range(count * per_bulk)]
    return [
        b'{"jobs":[' + b",".join(items[start : start + per_bulk]) + b"]}"
        for start in range(0, len(items), per_bulk)
    ]


def text_bodies(model: str, texts: Sequence[str], per_job: int) -> list[bytes]:
    """`{"model", "inputs": {"text": [...]}}` bodies of `per_job` texts each, every
    rotation of `texts` once (an embedding model's jobs)."""
    bodies = []
    for first in range(len(texts)):
        batch = [texts[(first + i) % len(texts)] for i in range(per_job)]
        bodies.append(json.dumps({"model": model, "inputs": {"text": batch}}).encode())
    return bodies


def job_bodies(model: str, rows: Sequence[Sequence[float]], rows_per_job: int) -> list[bytes]:
    """Request bodies, encoded once: `{"model", "inputs": {"pixels": [...]}}`, the
    service's own format, sent unchanged to every contender."""
    bodies = []
    for start in range(0, len(rows), rows_per_job):
        chunk = [list(map(float, r)) for r in rows[start : start + rows_per_job]]
        if len(chunk) == rows_per_job:
            bodies.append(json.dumps({"model": model, "inputs": {"pixels": chunk}}).encode())
    return bodies
