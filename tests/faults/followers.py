"""Clients that follow generations through a fault, and what they got.

`EventFollower` reads a job's Server-Sent Events (GET /jobs/<id>/events) as a
browser's EventSource does: whenever its connection fails, or the test cuts it,
it connects again with `Last-Event-ID` set to the last event it got, until the
terminal event. `StreamingCall` is a client of the OpenAI-compatible door
(`/v1/chat/completions` with `"stream": true`), which cannot resume: a call cut
off keeps what it got. Each follows the job of its call by its events too.

`TokenDiff` counts, in token ids of the model's own tokenizer, what a followed
text holds beyond an uninterrupted run's text (duplicate tokens) and what it
lacks of it (missing tokens): the edits of a longest-matching alignment.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import requests
from tokenizers import Tokenizer

from tests.faults.harness import TERMINAL, FaultStack
from tests.generation.test_jobs import sse_event

MODEL = "smollm2"


def chat(prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy chat call of the OpenAI-compatible door."""
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip


def greedy_references(stack: FaultStack, bodies: list[dict[str, Any]]) -> list[str]:
    """Each call's text from an uninterrupted run (no fault staged or injected yet)."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}

    def run(body: dict[str, Any]) -> str:
        r = requests.post(f"{stack.base}/v1/chat/completions", json=body, headers=headers,
                          timeout=300)  # fmt: skip
        assert r.status_code == 200, r.text
        text: str = r.json()["choices"][0]["message"]["content"]
        return text

    threads: list[threading.Thread] = []
    texts: dict[int, str] = {}
    for i, body in enumerate(bodies):
        thread = threading.Thread(target=lambda i=i, body=body: texts.__setitem__(i, run(body)))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return [texts[i] for i in range(len(bodies))]


def _blocks(response: requests.Response) -> Any:
    """The response's SSE blocks (text between blank lines) as they arrive."""
    buffer = b""
    for chunk in response.iter_content(chunk_size=None):
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            yield block.decode()


@dataclass
class EventFollower:
    """Follows one job's events to the end; `cut(n)` after the n-th event it got
    (but the last) says whether to drop the connection there, and reconnect."""

    stack: FaultStack
    job_id: str
    timeout_s: float = 120.0
    cut: Callable[[int], bool] = lambda n: False
    text: str = ""  # the output events' texts, joined
    event_ids: list[int] = field(default_factory=list)
    outputs: int = 0
    connections: int = 0
    cuts: int = 0
    failures: int = 0  # connections that failed or were refused
    status: str | None = None  # the terminal event's
    final_text: str | None = None  # the terminal event's outputs.text
    thread: threading.Thread | None = None

    def start(self) -> EventFollower:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def join(self, deadline: float) -> EventFollower:
        """Waits for the end, or until `deadline` (time.monotonic())."""
        assert self.thread is not None
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return self

    def _run(self) -> None:
        url = f"{self.stack.base}/jobs/{self.job_id}/events"
        deadline = time.monotonic() + self.timeout_s
        while self.status is None and time.monotonic() < deadline:
            headers = {"Authorization": f"Bearer {self.stack.api_key}"}
            if self.event_ids:
                headers["Last-Event-ID"] = str(self.event_ids[-1])
            try:
                with requests.get(url, headers=headers, stream=True, timeout=(5, 20)) as r:
                    if r.status_code != 200:
                        self.failures += 1
                        time.sleep(0.2)
                        continue
                    self.connections += 1
                    self._read(r)
            except requests.RequestException:
                self.failures += 1
                time.sleep(0.2)

    def _read(self, response: requests.Response) -> None:
        for block in _blocks(response):
            event = sse_event(block)
            if event is None:
                continue  # a keepalive
            self.event_ids.append(event["id"])
            status = event["event"].removeprefix("job.")
            if event["event"] == "output":
                self.text += event["data"]
                self.outputs += 1
            elif status in TERMINAL:
                self.status = status
                outputs = event["data"]["job"].get("outputs") or {}
                self.final_text = outputs.get("text")
                return
            if self.cut(len(self.event_ids)):
                self.cuts += 1
                return  # the connection closes: the next resumes after this event


@dataclass
class StreamingCall:
    """One streaming chat call, and an `EventFollower` of its job."""

    stack: FaultStack
    body: dict[str, Any]
    timeout_s: float = 120.0
    cut: Callable[[int], bool] = lambda n: False  # the event follower's
    text: str = ""  # the content of its chunks, joined
    done: bool = False  # it ended with `data: [DONE]`
    error: str | None = None  # an error chunk, or how the stream broke off
    job_id: str | None = None
    events: EventFollower | None = None
    thread: threading.Thread | None = None
    _started: threading.Event = field(default_factory=threading.Event)

    def start(self) -> StreamingCall:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._started.wait(60)
        return self

    def join(self, deadline: float) -> StreamingCall:
        """Waits for the call's end and its events', or until `deadline`."""
        assert self.thread is not None
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.events is not None:
            self.events.join(deadline)
        return self

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.stack.api_key}"}
        body = {**self.body, "stream": True}
        try:
            with requests.post(f"{self.stack.base}/v1/chat/completions", json=body,
                               headers=headers, stream=True, timeout=(5, 60)) as r:  # fmt: skip
                self.job_id = r.headers.get("X-Job-Id")
                if self.job_id is not None:
                    self.events = EventFollower(self.stack, self.job_id, self.timeout_s,
                                                self.cut).start()  # fmt: skip
                self._started.set()
                if r.status_code != 200:
                    self.error = f"{r.status_code}: {r.text[:200]}"
                    return
                for block in _blocks(r):
                    data = block.removeprefix("data: ")
                    if data == "[DONE]":
                        self.done = True
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        self.error = str(chunk["error"])
                        continue
                    for choice in chunk.get("choices", []):
                        self.text += choice.get("delta", {}).get("content") or ""
            self.error = "the stream ended without [DONE]"
        except (requests.RequestException, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._started.set()


class TokenDiff:
    def __init__(self, model_repository: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(model_repository / MODEL / "1" / "tokenizer.json"))

    def ids(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def __call__(self, got: str, want: str) -> tuple[int, int]:
        """(duplicate tokens, missing tokens) of `got` against `want`."""
        extra = missing = 0
        matcher = SequenceMatcher(None, self.ids(got), self.ids(want), autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag in ("delete", "replace"):
                extra += i2 - i1
            if tag in ("insert", "replace"):
                missing += j2 - j1
        return extra, missing
