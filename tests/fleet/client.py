"""The fleet's load client, run on the `client` host: async jobs and sync calls at
fixed rates, alternating between the API hosts, every submit and answer written
to a history (one JSON object a line) for the checker to read afterwards, as
Jepsen's clients do.

Open loop: each kind has its own schedule (the i-th request is due at start +
i / rate) and a pool of threads taking the due slots, so a host that hangs holds
threads, not the schedule. Each thread keeps one keep-alive connection per API
host (`http.client`, pre-encoded bodies: the client costs little CPU).
Every async submit carries an Idempotency-Key: a submit whose answer was lost
(a timeout, a reset) is looked up by its key afterwards, so the checker knows
whether it was accepted.

    python -m tests.fleet.client --apis http://A:8000,http://B:8000 --key KEY \\
        --history history.jsonl --duration 600 --async-rate 50 --sync-rate 5
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

ASYNC_TIMEOUT_S = 10.0
# Beyond this a sync call counts as left hanging: past the service's own timeout
# (SYNC_TIMEOUT_SECONDS, 30 s), by which it answers 504 with the job's id.
SYNC_TIMEOUT_S = 45.0


def pixels(rows: int) -> list[list[float]]:
    return [[float((i * 7 + j) % 16) for j in range(64)] for i in range(rows)]


class History:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the run
        self._lock = threading.Lock()

    def write(self, **event: object) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")


class Balancer:
    """Round robin over the API hosts, passing over one that failed a connection in
    the last DOWN_S, as a load balancer's passive health check does."""

    DOWN_S = 5.0

    def __init__(self, apis: list[str]) -> None:
        self.apis = apis
        self._down: dict[str, float] = {}

    def pick(self, i: int, avoid: str | None = None) -> str:
        now = time.monotonic()
        for k in range(len(self.apis)):
            api = self.apis[(i + k) % len(self.apis)]
            if api != avoid and self._down.get(api, 0.0) <= now:
                return api
        return self.apis[i % len(self.apis)]

    def failed(self, api: str) -> None:
        self._down[api] = time.monotonic() + self.DOWN_S


class Connections:
    """One keep-alive connection per API host, for one thread."""

    def __init__(self, apis: list[str], timeout: float) -> None:
        self.apis, self.timeout = apis, timeout
        self._open: dict[str, http.client.HTTPConnection] = {}

    def request(
        self, api: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """POST on this thread's connection to `api`. A kept-alive connection the server
        closed meanwhile (a broken pipe, or closed before any answer) is opened
        again and the request sent once more, as HTTP clients do: the requests here
        are safe to repeat (sync calls compute, submits carry an Idempotency-Key)."""
        reused = api in self._open
        try:
            return self._post(api, path, body, headers)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            if not reused:
                raise
            return self._post(api, path, body, headers)

    def _post(self, api: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = self._open.get(api)
        if conn is None:
            parts = urlsplit(api)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
            self._open[api] = conn
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            return response.status, response.read()
        except BaseException:
            conn.close()
            del self._open[api]
            raise


def paced(
    rate: float, duration: float, threads: int, send: Callable[[int, Connections], None],
    apis: list[str], timeout: float,
) -> list[threading.Thread]:  # fmt: skip
    """`threads` threads sending request i at start + i / rate, until `duration`."""
    start, counter, lock = time.monotonic(), [0], threading.Lock()
    total = int(rate * duration)

    def run() -> None:
        connections = Connections(apis, timeout)
        while True:
            with lock:
                i = counter[0]
                counter[0] += 1
            if i >= total:
                return
            due = start + i / rate
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            send(i, connections)

    pool = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    return pool


TERMINAL_EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.expired")
PROMPTS = ("Once upon a time", "The three primary colours are", "A good breakfast has")


def follow(
    apis: list[str], job_id: str, auth: dict[str, str], give_up: float
) -> tuple[str, dict[str, Any] | None, int]:
    """Follow a job's event stream to its end, resuming with Last-Event-ID on the
    other API host whenever a connection drops: the streamed text, the terminal
    event's job, and how many times it reconnected."""
    text, last_id, reconnects, i = [], "", 0, 0
    while time.time() < give_up:
        api = urlsplit(apis[i % len(apis)])
        i += 1
        conn = http.client.HTTPConnection(api.hostname, api.port, timeout=SYNC_TIMEOUT_S)
        headers = {**auth, **({"Last-Event-ID": last_id} if last_id else {})}
        try:
            conn.request("GET", f"/jobs/{job_id}/events", headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                raise OSError(f"events answered {response.status}")
            event: dict[str, str] = {}
            data: list[str] = []
            while line := response.readline():
                line = line.decode().rstrip("\n")
                if line:
                    name, _, value = line.partition(": ")
                    if name == "data":
                        data.append(value)
                    elif not name.startswith(":"):
                        event[name] = value
                    continue
                if event.get("event") == "output":
                    text.append("\n".join(data))
                elif event.get("event") in TERMINAL_EVENTS:
                    return "".join(text), json.loads("\n".join(data))["job"], reconnects
                last_id = event.get("id", last_id)
                event, data = {}, []
        except (OSError, http.client.HTTPException, ValueError):
            pass
        finally:
            conn.close()
        reconnects += 1
        time.sleep(0.5)
    return "".join(text), None, reconnects


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--apis", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--async-rate", type=float, default=50)
    parser.add_argument("--sync-rate", type=float, default=5)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--rows", type=int, default=1, help="rows of 64 values per request")
    parser.add_argument("--generations", type=int, default=0, help="concurrent generations")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    apis = args.apis.split(",")
    history = History(args.history)
    auth = {"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"}
    rows = pixels(args.rows)
    job_body = json.dumps({"model": args.model, "inputs": {"pixels": rows}}).encode()
    infer_body = json.dumps({"inputs": [
        {"name": "pixels", "shape": [len(rows), 64], "datatype": "FP32",
         "data": [v for row in rows for v in row]}]}).encode()  # fmt: skip

    balancer = Balancer(apis)

    def send(
        kind: str, i: int, connections: Connections, path: str, body: bytes,
        headers: dict[str, str], **noted: object,
    ) -> tuple[int, bytes] | None:  # fmt: skip
        """POST through the balancer: a host that fails the connection is marked down
        and the request goes once to another (the same Idempotency-Key, for a submit).
        One history event: the last host tried, and the one failed over from."""
        started, api, failed_over_from = time.time(), balancer.pick(i), None
        while True:
            try:
                status, answer = connections.request(api, path, body, headers)
            except (OSError, http.client.HTTPException) as exc:
                balancer.failed(api)
                if failed_over_from is None and len(apis) > 1:
                    failed_over_from, api = api, balancer.pick(i + 1, avoid=api)
                    continue
                history.write(kind=kind, t=started, api=api, error=type(exc).__name__,
                              latency=time.time() - started, failed_over_from=failed_over_from,
                              **noted)  # fmt: skip
                return None
            history.write(kind=kind, t=started, api=api, status=status,
                          latency=time.time() - started, failed_over_from=failed_over_from,
                          **noted, **(
                              {"id": json.loads(answer).get("id") if status in (200, 201, 202)
                               else None} if kind == "submit" else {}))  # fmt: skip
            return status, answer

    def submit(i: int, connections: Connections) -> None:
        key = str(uuid.uuid4())
        send("submit", i, connections, "/jobs", job_body, {**auth, "Idempotency-Key": key},
             key=key)  # fmt: skip

    def infer(i: int, connections: Connections) -> None:
        send("sync", i, connections, f"/v2/models/{args.model}/infer", infer_body, auth)

    def generate(stream: int) -> None:
        """Generations one after another until the run's end, each followed live."""
        connections, n, end = Connections(apis, ASYNC_TIMEOUT_S), 0, time.time() + args.duration
        while time.time() < end:
            prompt, key = PROMPTS[(stream + n) % len(PROMPTS)], str(uuid.uuid4())
            n += 1
            body = json.dumps({"model": "smollm2", "inputs": {"prompt": prompt},
                               "parameters": {"max_tokens": args.max_tokens,
                                              "temperature": 0}}).encode()  # fmt: skip
            started, job_id = time.time(), None
            for attempt in range(20):  # each API host in turn until one accepts it
                try:
                    status, answer = connections.request(
                        apis[(n + attempt) % len(apis)], "/jobs", body,
                        {**auth, "Idempotency-Key": key})  # fmt: skip
                except (OSError, http.client.HTTPException):
                    continue
                if status == 202:
                    job_id = json.loads(answer)["id"]
                    break
                time.sleep(1)
            if job_id is None:
                history.write(kind="generation", t=started, key=key, prompt=prompt, id=None)
                continue
            text, job, reconnects = follow(apis, job_id, auth, end + 120)
            history.write(kind="generation", t=started, key=key, prompt=prompt, id=job_id,
                          streamed=text, status=job and job["status"],
                          final=job and (job.get("outputs") or {}).get("text"),
                          reconnects=reconnects, ended=time.time())  # fmt: skip

    generators = [threading.Thread(target=generate, args=(i,), daemon=True)
                  for i in range(args.generations)]  # fmt: skip
    for thread in generators:
        thread.start()
    pools = generators + paced(args.async_rate, args.duration, 16, submit, apis, ASYNC_TIMEOUT_S)
    pools += paced(args.sync_rate, args.duration, 8, infer, apis, SYNC_TIMEOUT_S)
    for thread in pools:
        thread.join()
    history.write(kind="end", t=time.time())


if __name__ == "__main__":
    main()
