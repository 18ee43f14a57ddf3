"""How close the int4 graph's answers are to the float32 graph's, and to llama.cpp's.

The 20 fixed prompts (the benchmark's 16 and 4 more) as chat messages, greedy, at
most TOKENS tokens each, through the decode engine on both graphs (CPU, the
benchmark's threads): how many answers are the same token for token, how many
tokens the two share from the start on average, and how the first step's logits
agree (Pearson correlation, the largest difference against their spread).
llama-server's greedy answers to the same prompts (same GGUF) are compared as
text, since its tokens are not returned.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.generation import PROMPTS, SLOTS, THREADS

TOKENS = 32
MORE = [
    "What is the largest planet in the solar system?",
    "Give me three tips for a job interview.",
    "Translate 'good morning' into French.",
    "Why is the sky blue?",
]
ALL = PROMPTS + MORE


def _answers(card_dir: Path) -> tuple[list[list[int]], list[np.ndarray], Any]:
    from app.cards import ModelCard
    from app.generation.chat import ChatFormat
    from app.runtime.decode import DecodeEngine, Sequence
    from app.runtime.sampling import Sampling
    from bench.generation_engine import session as cpu_session

    card = ModelCard.load(card_dir)
    assert card.generation is not None
    chat = ChatFormat(card_dir / "tokenizer.json", card.generation)
    session = cpu_session(card.onnx_path, "cpu", THREADS)
    engine = DecodeEngine(session, slots=SLOTS, context=512,
                          stop_tokens=card.generation.stop_tokens)  # fmt: skip
    sequences = [Sequence(i, chat.chat_ids((("user", p),)), Sampling(max_tokens=TOKENS,
                 temperature=0)) for i, p in enumerate(ALL)]  # fmt: skip
    waiting = list(sequences)
    while waiting or engine.busy:
        while waiting and engine.room():
            engine.add(waiting.pop(0))
        engine.step()
    logits = [s.prompt_logits for s in sequences]
    assert all(x is not None for x in logits)
    return [s.generated for s in sequences], logits, chat  # type: ignore[return-value]


def _shared(a: list[Any], b: list[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a),
                len(b)))  # fmt: skip


def compare(fp32_dir: Path, int4_dir: Path) -> dict[str, Any]:
    exact, exact_logits, chat = _answers(fp32_dir)
    small, small_logits, _ = _answers(int4_dir)
    same = sum(a == b for a, b in zip(exact, small, strict=True))
    corr = [float(np.corrcoef(a, b)[0, 1]) for a, b in zip(exact_logits, small_logits,
                                                            strict=True)]  # fmt: skip
    worst = max(float(np.abs(a - b).max() / a.std()) for a, b in zip(exact_logits, small_logits,
                                                                      strict=True))  # fmt: skip
    decode = chat.tokenizer.decode
    return {
        "prompts": len(ALL), "max_tokens": TOKENS,
        "int4_same_as_fp32": same,
        "int4_shared_tokens_mean": round(float(np.mean(
            [_shared(a, b) / max(1, len(a)) for a, b in zip(exact, small, strict=True)])), 3),
        "logits_correlation_mean": round(float(np.mean(corr)), 5),
        "logits_correlation_min": round(min(corr), 5),
        "logits_largest_difference_in_spreads": round(worst, 3),
        "texts": {"fp32": [decode(t) for t in exact], "int4": [decode(t) for t in small]},
    }  # fmt: skip


def llama_texts(port: int) -> list[str]:
    """llama-server's greedy answers to the prompts."""
    texts = []
    for prompt in ALL:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": TOKENS, "top_k": 1}  # fmt: skip
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        answer = json.loads(conn.getresponse().read())
        conn.close()
        texts.append(answer["choices"][0]["message"]["content"] or "")
    return texts


def against_llama(quality: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for graph in ("fp32", "int4"):
        ours = quality["texts"][graph]
        found[f"{graph}_same_as_llama_cpp"] = sum(a.strip() == b.strip() for a, b in
                                                  zip(ours, texts, strict=True))  # fmt: skip
        found[f"{graph}_shared_chars_mean"] = round(
            float(
                np.mean([_shared(a, b) / max(1, len(b)) for a, b in zip(ours, texts, strict=True)])
            ),
            3,
        )
    return found


def lines(data: dict[str, Any]) -> list[str]:
    q = data.get("quality")
    if not q:
        return []
    out = [
        f"int4 against float32, {q['prompts']} prompts, greedy, {q['max_tokens']} tokens: "
        f"{q['int4_same_as_fp32']} answers the same; {q['int4_shared_tokens_mean']} of the "
        f"tokens shared from the start on average; first logits' correlation "
        f"{q['logits_correlation_mean']} (least {q['logits_correlation_min']}), largest "
        f"difference {q['logits_largest_difference_in_spreads']} of their spread."
    ]
    if "llama_cpp" in q:
        lc = q["llama_cpp"]
        out.append(f"Against llama-server's greedy answers (text): float32 "
                   f"{lc['fp32_same_as_llama_cpp']} the same ({lc['fp32_shared_chars_mean']} of "
                   f"the characters shared from the start), int4 {lc['int4_same_as_llama_cpp']} "
                   f"({lc['int4_shared_chars_mean']}).")  # fmt: skip
    return [*out, ""]
