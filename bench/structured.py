"""Structured output and label scores in the generation benchmark.

Constrained decoding's cost: tokens/s of streaming chat calls whose answer must
match a JSON schema (a story of 450 characters at least in a string field, so
about as long as the plain calls' prose) against the same calls without, at 1
and 16 streams, through the service;
and on the decode engine alone (the mask's cost, without the service around it).
Label scores: rows/s of a sentiment label with its probability (one prefill, the
labels scored) against generating the label greedily (a prefill and the decode
steps of its tokens), 16 calls at a time.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

from bench.generation import MAX_TOKENS, PROMPTS, SLOTS, THREADS, drive

# A story of 450 characters at least (about 100 tokens): the answers run about as long
# as the prose ones (at most MAX_TOKENS), so the two are read at the same lengths.
STORY = {"type": "json_schema", "json_schema": {"name": "story", "strict": True, "schema": {
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 60},
                                     "story": {"type": "string", "minLength": 450}},
    "required": ["title", "story"], "additionalProperties": False}}}  # fmt: skip
REVIEWS = [
    "I love this phone, the battery lasts for days!",
    "The delivery was late and the box was broken.",
    "Absolutely wonderful experience, thank you!",
    "Terrible service, I will never order again.",
    "The package arrived on Tuesday.",
    "Great value for the price, works perfectly.",
    "The screen cracked after one week.",
    "It does what it says, nothing more.",
]
LABELS = ["positive", "negative", "neutral"]


def service(port: int, headers: dict[str, str], quick: bool) -> dict[str, Any]:
    """Through the service: constrained levels, and label scoring against greedy labels."""
    levels: dict[str, list[dict[str, Any]]] = {"free": [], "constrained": []}
    for streams in (1, 16):
        # Several rounds a stream: the batch stays nearer full while answers of
        # different lengths end (a schema's answers end sooner than prose).
        rounds = (2 if quick else 4) if streams == 1 else (2 if quick else 3)
        for kind, extra in (("free", {}), ("constrained", {"response_format": STORY})):
            level = drive(port, "/v1/chat/completions", headers, "smollm2", streams, rounds,
                          extra=extra)  # fmt: skip
            levels[kind].append(level.summary())
    rows = 32 if quick else 96
    scored = _rows(port, headers, rows, {"labels": LABELS})
    greedy = _rows(port, headers, rows, {"temperature": 0, "max_tokens": 3})
    return {"structured_levels": levels, "labels": {
        "rows": rows, "scored_rows_per_s": scored, "greedy_rows_per_s": greedy}}  # fmt: skip


def _rows(port: int, headers: dict[str, str], rows: int, fields: dict[str, Any]) -> float:
    """`rows` sentiment calls, 16 at a time (non-streaming): rows per second."""
    ask = "Is the sentiment of this review positive, negative or neutral? Answer with one word."
    bodies = [json.dumps({"model": "smollm2", "messages": [{"role": "user", "content":
              f"{ask}\n\n{REVIEWS[i % len(REVIEWS)]} ({i})"}], **fields}).encode()
              for i in range(rows)]  # fmt: skip
    lock, left = threading.Lock(), list(range(rows))

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            while True:
                with lock:
                    if not left:
                        return
                    index = left.pop()
                conn.request("POST", "/v1/chat/completions", bodies[index],
                             {"Content-Type": "application/json", **headers})  # fmt: skip
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    raise RuntimeError(f"answered {response.status}: {body[:300]!r}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(SLOTS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(rows / (time.perf_counter() - started), 1)


def engine(card_dir: Path, quick: bool) -> dict[str, Any]:
    """The decode engine alone, greedy, kept full: tokens/s of 1 and 16 sequences
    decoding (a finished one replaced at once, its prefill not timed) with the
    story schema's guide against the same without, over the same decode steps."""
    import onnxruntime as ort

    from app.cards import ModelCard
    from app.generation.chat import ChatFormat
    from app.generation.requests import parse
    from app.runtime.decode import DecodeEngine, Sequence

    card = ModelCard.load(card_dir)
    spec = card.generation
    assert spec is not None
    chat = ChatFormat(card.path / "tokenizer.json", spec)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(str(card.onnx_path), options,
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    steps = 48 if quick else 160
    found: dict[str, Any] = {}
    for streams in (1, 16):
        for kind, extra in (("free", {}), ("constrained", {"response_format": STORY})):
            engine_ = DecodeEngine(session, slots=SLOTS, context=2048,
                                   stop_tokens=spec.stop_tokens)  # fmt: skip
            made, took, added = 0, 0.0, 0
            for _ in range(steps):
                while engine_.busy < streams:  # (a finished sequence is replaced)
                    chat_ = [{"role": "user", "content": PROMPTS[added % len(PROMPTS)]}]
                    knobs = {"temperature": 0, "max_tokens": MAX_TOKENS, **extra}
                    asked = parse(spec, {"messages": chat_}, knobs)
                    engine_.add(Sequence(added, chat.encode(asked), asked.sampling,
                                         chat.guide(asked)))  # fmt: skip
                    added += 1
                while engine_.waiting:
                    engine_.prefill(10_000)
                started = time.perf_counter()
                made += len(engine_.decode())
                took += time.perf_counter() - started
            found[f"{kind}{streams}_tokens_per_s"] = round(made / took, 1)
    return found
