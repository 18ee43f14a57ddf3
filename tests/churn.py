"""Clients on every door of a running service while its model repository changes:
the churn both `tests/api/test_churn.py` (in-process doors over real workers) and
fault scenario 25 (every process its own) drive, and what each call and job came to.

Sixteen clients of four tenants call for as long as the churn runs: KServe v2 over
HTTP in JSON and binary (Triton's own client), gRPC unary and streaming, an inline
model, and async jobs on two models. Meanwhile `run` adds a third model and calls it
once on every door, rolls a copy of digits to version 2, unloads version 1, and removes the
third model. Every call must be answered 2xx, or 404 for a model or version that is
gone, or 503 (a worker lost, none serving yet); never a 504 or another 5xx. Every
accepted job must end in a terminal state.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

PIXELS = np.zeros((1, 64), np.float32)
ROW = {"pixels": PIXELS.tolist()}
FINE = {200, 202}
GONE = 404  # the model or version a call named is gone
LATER = {429, 503}  # Retry-After: a worker lost, none serving yet, a tenant's bound
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


@dataclass
class Repository:
    """How the churn changes the repository: each takes a model's name (and version)."""

    add_identity: Callable[[str], None]  # a new model: FP32 INPUT0 [-1, 4] -> OUTPUT0
    add_version: Callable[[str], None]  # one more version of an existing model
    unload: Callable[[str, str], None]
    remove: Callable[[str], None]


@dataclass
class Outcomes:
    """Each door's answers by status (gRPC codes as their HTTP peers), and the jobs."""

    calls: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # door, model, status
    unexpected: list[str] = field(default_factory=list)
    jobs: list[tuple[str, str]] = field(default_factory=list)  # (tenant key, job id)
    first_answer_s: dict[str, float] = field(default_factory=dict)  # door -> s after the add
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, door: str, model: str, status: int, detail: str = "") -> None:
        with self.lock:
            self.calls[(door, model, status)] += 1
            if status not in FINE | LATER and status != GONE:
                self.unexpected.append(f"{door} {model}: {status} {detail[:300]}")

    def total(self, statuses: set[int]) -> int:
        return sum(n for (_, _, status), n in self.calls.items() if status in statuses)


_GRPC_AS_HTTP = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
}


def grpc_status(exc: triton_grpc.InferenceServerException) -> int:
    """A unary call's status code; a stream's error names its code in its message
    (`request '<id>': NOT_FOUND: ...`, as the door writes `error_message`)."""
    code = next((c for c in grpc.StatusCode if str(c) == exc.status()), None)
    if code is None:
        message = str(exc.message())
        code = next((c for c in grpc.StatusCode if f"{c.name}:" in message), None)
    return _GRPC_AS_HTTP.get(code, 500) if code is not None else 500


class Churn:
    def __init__(
        self, http_base: str, grpc_target: str, keys: list[str], inline: str,
        rolled: str = "digits",
    ) -> None:  # fmt: skip
        """`keys`: four tenants' API keys; `inline`: a model whose card runs it inline;
        `rolled`: the model rolled to version 2 (a copy of digits; its versions'
        states are shared by every process on the database)."""
        self.http_base, self.grpc_target, self.keys = http_base, grpc_target, keys
        self.inline, self.rolled = inline, rolled
        self.outcomes = Outcomes()
        self.third: str | None = None  # the model added mid-run, while it serves
        self.pinned = rolled  # what the pinned clients name: the model, then its version 1
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Churn:
        loops = [self._http_json] * 4 + [self._http_binary] * 2 + [self._grpc_unary] * 3
        loops += [self._grpc_stream] * 2 + [self._inline] * 2 + [self._submit] * 3
        for i, loop in enumerate(loops):
            key = self.keys[i % len(self.keys)]
            thread = threading.Thread(target=self._guarded, args=(loop, key), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def run(self, repository: Repository, third: str, settle_s: float = 2.0) -> None:
        """The churn itself, with the clients calling throughout."""
        time.sleep(settle_s)
        repository.add_identity(third)
        added_at = time.monotonic()
        self.third = third
        self._call_third_on_every_door(third, added_at)
        time.sleep(settle_s)
        repository.add_version(self.rolled)  # version 2: unversioned calls go to it
        self.pinned = f"{self.rolled}:1"
        time.sleep(settle_s)
        repository.unload(self.rolled, "1")
        time.sleep(settle_s)
        repository.remove(third)
        time.sleep(settle_s)

    # The doors ----------------------------------------------------------------

    def _models(self) -> list[str]:
        return [self.rolled, self.pinned] + ([self.third] if self.third else [])

    def _guarded(self, loop: Callable[[str], None], key: str) -> None:
        try:
            loop(key)
        except Exception as exc:  # a client that broke is an outcome too
            self.outcomes.record("client", loop.__name__, 599, f"{type(exc).__name__}: {exc}")

    def _http_json(self, key: str) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {key}"}
        for i in itertools.count():
            if self._stop.is_set():
                return
            model = self._models()[i % len(self._models())]
            status, detail = self._json_call(session, headers, model)
            self.outcomes.record("http-json", _shown(model), status, detail)

    def _json_call(self, session: requests.Session, headers: dict[str, str],
                   model: str) -> tuple[int, str]:  # fmt: skip
        name, _, version = model.partition(":")
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
        body = {"inputs": [_tensor_json(name == self.third)]}
        try:
            response = session.post(self.http_base + path, json=body, headers=headers, timeout=60)
        except requests.RequestException as exc:
            return 598, str(exc)
        return response.status_code, response.text

    def _http_binary(self, key: str) -> None:
        client = triton_http.InferenceServerClient(self.http_base.removeprefix("http://"),
                                                   network_timeout=60)  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        for i in itertools.count():
            if self._stop.is_set():
                return
            model = self._models()[i % len(self._models())]
            name, _, version = model.partition(":")
            try:
                client.infer(name, [_tensor_http(name == self.third)], model_version=version,
                             headers=headers)  # fmt: skip
                status, detail = 200, ""
            except triton_http.InferenceServerException as exc:
                status, detail = int(exc.status() or 500), str(exc.message())
            self.outcomes.record("http-binary", _shown(model), status, detail)

    def _grpc_unary(self, key: str) -> None:
        client = triton_grpc.InferenceServerClient(self.grpc_target)
        headers = {"authorization": f"Bearer {key}"}
        for i in itertools.count():
            if self._stop.is_set():
                return
            model = self._models()[i % len(self._models())]
            name, _, version = model.partition(":")
            try:
                client.infer(name, [_tensor_grpc(name == self.third)], model_version=version,
                             headers=headers, client_timeout=60)  # fmt: skip
                status, detail = 200, ""
            except triton_grpc.InferenceServerException as exc:
                status, detail = grpc_status(exc), str(exc.message())
            self.outcomes.record("grpc-unary", _shown(model), status, detail)

    def _grpc_stream(self, key: str) -> None:
        client = triton_grpc.InferenceServerClient(self.grpc_target)
        answers: list[Any] = []
        heard = threading.Event()

        def callback(result: Any, error: Any) -> None:
            answers.append(error if error is not None else result)
            heard.set()

        client.start_stream(callback, headers={"authorization": f"Bearer {key}"})
        try:
            for i in itertools.count():
                if self._stop.is_set():
                    return
                model = self._models()[i % len(self._models())]
                name, _, version = model.partition(":")
                heard.clear()
                client.async_stream_infer(name, [_tensor_grpc(name == self.third)],
                                          model_version=version)  # fmt: skip
                if not heard.wait(60):
                    self.outcomes.record("grpc-stream", _shown(model), 504, "no answer in 60 s")
                    return
                answer = answers.pop()
                if isinstance(answer, triton_grpc.InferenceServerException):
                    self.outcomes.record("grpc-stream", _shown(model), grpc_status(answer),
                                         str(answer.message()))  # fmt: skip
                else:
                    self.outcomes.record("grpc-stream", _shown(model), 200)
        finally:
            client.stop_stream()

    def _inline(self, key: str) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {key}"}
        while not self._stop.is_set():
            status, detail = self._json_call(session, headers, self.inline)
            self.outcomes.record("inline", self.inline, status, detail)

    def _submit(self, key: str) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {key}"}
        for i in itertools.count():
            if self._stop.is_set():
                return
            model = (self.rolled, self.inline, self.pinned)[i % 3]
            name, _, version = model.partition(":")
            body: dict[str, Any] = {"model": name, "inputs": ROW}
            if version:
                body["version"] = version
            try:
                response = session.post(f"{self.http_base}/jobs", json=body, headers=headers,
                                        timeout=60)  # fmt: skip
            except requests.RequestException as exc:
                self.outcomes.record("jobs", model, 598, str(exc))
                continue
            self.outcomes.record("jobs", model, response.status_code, response.text)
            if response.status_code == 202:
                with self.outcomes.lock:
                    self.outcomes.jobs.append((key, response.json()["id"]))
            time.sleep(0.02)

    def _call_third_on_every_door(self, third: str, added_at: float) -> None:
        """The model just added, called once on each door, timed from the add."""
        key = self.keys[0]
        headers = {"Authorization": f"Bearer {key}"}

        def http_json() -> None:
            response = requests.post(f"{self.http_base}/v2/models/{third}/infer",
                                     json={"inputs": [_tensor_json(True)]}, headers=headers,
                                     timeout=60)  # fmt: skip
            assert response.status_code == 200, response.text

        def http_binary() -> None:
            client = triton_http.InferenceServerClient(self.http_base.removeprefix("http://"))
            client.infer(third, [_tensor_http(True)], headers=headers)

        def grpc_unary() -> None:
            client = triton_grpc.InferenceServerClient(self.grpc_target)
            client.infer(third, [_tensor_grpc(True)], headers={"authorization": f"Bearer {key}"})

        for door, call in (("http-json", http_json), ("http-binary", http_binary),
                           ("grpc-unary", grpc_unary)):  # fmt: skip
            call()
            self.outcomes.first_answer_s[door] = round(time.monotonic() - added_at, 3)

    def wait_for_jobs(self, statuses: Callable[[str, list[str]], dict[str, str]],
                      timeout_s: float) -> dict[str, str]:  # fmt: skip
        """Each accepted job's status once all are terminal, or at `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        by_key: dict[str, list[str]] = {}
        for key, job_id in self.outcomes.jobs:
            by_key.setdefault(key, []).append(job_id)
        while True:
            found: dict[str, str] = {}
            for key, ids in by_key.items():
                found.update(statuses(key, ids))
            if all(s in TERMINAL for s in found.values()) or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def _shown(model: str) -> str:
    return "third" if model.startswith("third") else model


def _tensor_json(identity: bool) -> dict[str, Any]:
    if identity:
        return {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
    return {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}


def _tensor_http(identity: bool) -> triton_http.InferInput:
    name, shape = ("INPUT0", [1, 4]) if identity else ("pixels", [1, 64])
    tensor = triton_http.InferInput(name, shape, "FP32")
    tensor.set_data_from_numpy(np.ones(shape, np.float32), binary_data=True)
    return tensor


def _tensor_grpc(identity: bool) -> triton_grpc.InferInput:
    name, shape = ("INPUT0", [1, 4]) if identity else ("pixels", [1, 64])
    tensor = triton_grpc.InferInput(name, shape, "FP32")
    tensor.set_data_from_numpy(np.ones(shape, np.float32))
    return tensor
