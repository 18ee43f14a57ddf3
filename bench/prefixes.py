"""The prefix cache in the generation benchmark, through the service.

An instruction of about 1,000 tokens as the system prompt, and a short question:
- time to first token when the instruction was seen before (its rows kept)
  against one the service has never seen (a request number in front of it, so no
  kept prefix matches), one call at a time;
- a batch of rows sharing the instruction, 16 calls at a time, against the same
  rows each with an instruction of its own (the same length): end to end.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from bench.generation import stream_chat

DEPARTMENTS = ["sales", "repairs", "rentals", "accounts", "deliveries", "warranty"]
RULES = " ".join(
    f"Rule {i}: a message that mentions item {i * 7 % 97} goes to {DEPARTMENTS[i % 6]}, "
    f"unless it also asks about order {i * 13 % 101}, which goes to {DEPARTMENTS[(i + 3) % 6]}."
    for i in range(1, 32)
)
QUESTIONS = [
    "My order 14 has not arrived.", "The brake on item 21 squeaks.",
    "Can I rent item 35 on Sunday?", "I was charged twice for item 42.",
    "Is item 7 in stock?", "The gears of item 63 slip.",
]  # fmt: skip


def _instruction(seen: bool, n: int) -> str:
    head = "" if seen else f"Request {n}. "
    return (
        f"{head}You sort the messages customers send to a bicycle shop. {RULES} Answer with "
        "the department only."
    )


def _call(port: int, headers: dict[str, str], instruction: str, question: str) -> Any:
    body = {"model": "smollm2", "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "system", "content": instruction},
                         {"role": "user", "content": question}]}  # fmt: skip
    return stream_chat(port, "/v1/chat/completions", headers, body)


def _batch(port: int, headers: dict[str, str], rows: int, seen: bool) -> float:
    """Rows a second, 16 calls at a time."""
    todo = list(range(rows))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop()
            _call(port, headers, _instruction(seen, 10_000 + n), QUESTIONS[n % len(QUESTIONS)])

    threads = [threading.Thread(target=client) for _ in range(16)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows / (time.perf_counter() - started)


def service(port: int, headers: dict[str, str], quick: bool) -> dict[str, Any]:
    calls = 3 if quick else 6
    _call(port, headers, _instruction(True, 0), "Hello.")  # the instruction is kept
    ttft: dict[str, list[float]] = {"hit": [], "miss": []}
    for n in range(calls):
        for kind in ("miss", "hit"):
            call = _call(port, headers, _instruction(kind == "hit", n),
                         QUESTIONS[n % len(QUESTIONS)])  # fmt: skip
            ended = time.perf_counter()  # (an answer with no text: its end)
            ttft[kind].append((call.first or ended) - call.started)
    rows = 32 if quick else 100
    shared = _batch(port, headers, rows, seen=True)
    own = _batch(port, headers, rows, seen=False)
    return {"prefix": {
        "ttft_hit_p50_ms": round(float(np.median(ttft["hit"])) * 1000, 1),
        "ttft_miss_p50_ms": round(float(np.median(ttft["miss"])) * 1000, 1),
        "batch_rows": rows, "shared_rows_per_s": round(shared, 2),
        "own_rows_per_s": round(own, 2),
    }}  # fmt: skip


def targets(service: dict[str, Any]) -> list[dict[str, Any]]:
    prefix, found = service["prefix"], []
    ratio = round(prefix["ttft_miss_p50_ms"] / prefix["ttft_hit_p50_ms"], 2)
    found.append({"target": "1,000-token prefix seen before: TTFT miss / hit", "value": ratio,
                  "goal": ">= 5", "met": ratio >= 5})  # fmt: skip
    ratio = round(prefix["shared_rows_per_s"] / prefix["own_rows_per_s"], 2)
    found.append({"target": f"batch of {prefix['batch_rows']} rows sharing a 1,000-token "
                  "instruction: rows/s vs each its own", "value": ratio, "goal": ">= 3",
                  "met": ratio >= 3})  # fmt: skip
    return found


def lines(service: dict[str, Any]) -> list[str]:
    prefix = service.get("prefix")
    if not prefix:
        return []
    return [
        f"Prefix cache, a 1,000-token instruction: TTFT p50 {prefix['ttft_hit_p50_ms']} ms "
        f"seen before, {prefix['ttft_miss_p50_ms']} ms not; {prefix['batch_rows']} rows "
        f"16 at a time: {prefix['shared_rows_per_s']} rows/s sharing it, "
        f"{prefix['own_rows_per_s']} rows/s each with its own.",
        "",
    ]
