"""The decode engine's prefix cache: a prompt that starts with a kept prompt's
tokens copies their rows instead of prefilling them, and answers as a prefill
would; rows are kept per owner (tenant) and within their bytes (real ONNX
Runtime, and a real worker counting hits in its metrics)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from flask import Flask

from app.cards import ModelCard
from app.generation.chat import ChatFormat
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.prefixes import BLOCK, PrefixCache
from app.runtime.sequences import Sequence
from tests.conftest import WorkerProcess, make_tenant, wait_for_job
from tests.generation.test_model import engine, greedy, ids, run
from tests.observability.conftest import scrape, value
from tests.support import free_port, own_chat_model

INSTRUCTION = (
    "You sort customer messages for a bicycle shop. Read the message and answer with one "
    "short sentence that names the department that should handle it: sales for questions "
    "about buying a bicycle, prices, stock and delivery; repairs for broken parts, noises, "
    "flat tyres, brakes and gears; rentals for renting bicycles by the hour or the day; and "
    "accounts for invoices, refunds and passwords. Do not answer the message itself. "
) * 2


def ask(chat: ChatFormat, card: ModelCard, question: str) -> list[int]:
    messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]
    return ids(chat, card, {"messages": messages})


def test_a_kept_prefix_answers_as_a_prefill_with_only_the_rest_prefilled(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    first = ask(chat, card, "My rear brake squeaks when it rains.")
    second = ask(chat, card, "Can I rent two bicycles for Saturday?")
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared > 4 * BLOCK, "the instruction is long enough to be kept"

    plain = engine(session, card)
    alone = Sequence("alone", second, greedy(12))
    for _ in run(plain, [alone]):
        pass

    cached = engine(session, card, prefix_bytes=64 << 20)
    assert cached.prefixes is not None
    for _ in run(cached, [Sequence("first", first, greedy(4), owner=1)]):
        pass
    assert len(cached.prefixes) == 1 and cached.prefixes.counts.misses == 1
    again = Sequence("again", second, greedy(12), owner=1)
    cached.add(again)
    assert cached.prefill(), "the prompt was made whole in one call"
    taken = cached.prefilled
    while cached.busy:
        cached.step()
    kept = shared // BLOCK * BLOCK
    assert cached.prefixes.counts.hits == 1 and cached.prefixes.counts.tokens_saved == kept
    assert taken == len(second) - kept, "only the tokens after the kept prefix were prefilled"
    assert again.generated == alone.generated
    assert again.prompt_logits is not None and alone.prompt_logits is not None
    np.testing.assert_allclose(again.prompt_logits, alone.prompt_logits, atol=1e-3)


def test_questions_at_once_share_the_default_system_prompt_and_answer_as_alone(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    """Chats with no system message of their own, several at once (16 streams'
    first calls): the chat template's default system prompt is prefilled once,
    each later question only from where they part, and each answers as alone."""
    questions = ["What is the capital of France?", "Name three primary colours.",
                 "Write a haiku about rain.", "How many legs has a spider?"]  # fmt: skip
    prompts = [ids(chat, card, {"messages": [{"role": "user", "content": q}]}) for q in questions]
    shared = next(i for i, column in enumerate(zip(*prompts, strict=False)) if len(set(column)) > 1)
    assert shared >= 2 * BLOCK, "the default system prompt is long enough to be kept"
    alone = [Sequence(i, p, greedy(6)) for i, p in enumerate(prompts)]
    for _ in run(engine(session, card), alone):
        pass
    cached = engine(session, card, prefix_bytes=64 << 20)
    assert cached.prefixes is not None
    together = [Sequence(i, p, greedy(6), owner=1) for i, p in enumerate(prompts)]
    prefilled = 0
    for _ in run(cached, together):
        prefilled += cached.prefilled
    kept = shared // BLOCK * BLOCK
    counts = cached.prefixes.counts
    assert (counts.hits, counts.misses) == (len(prompts) - 1, 1)
    assert counts.tokens_saved >= kept * (len(prompts) - 1)
    assert prefilled == sum(map(len, prompts)) - counts.tokens_saved
    assert [s.generated for s in together] == [s.generated for s in alone]


def test_owners_never_share_kept_rows(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    prompt = ask(chat, card, "Where is my refund?")
    cached = engine(session, card, prefix_bytes=64 << 20)
    assert cached.prefixes is not None
    for owner in (1, 2, 1, None, 2):
        for _ in run(cached, [Sequence(owner, prompt, greedy(2), owner=owner)]):
            pass
    counts = cached.prefixes.take_counts()
    # Owner 1 keeps, owner 2 misses (and keeps its own), 1 hits, None misses, 2 hits.
    assert (counts.hits, counts.misses) == (2, 3)
    assert len(cached.prefixes) == 3


def test_kept_rows_stay_within_their_bytes_the_least_recently_used_dropped() -> None:
    saved: list[int] = []

    def save(n: int) -> Any:
        saved.append(n)
        return np.zeros(n)

    prefixes = PrefixCache(budget_bytes=3 * BLOCK * 10, token_bytes=10)  # three blocks' rows
    a, b, c = ([k] * (2 * BLOCK) for k in (1, 2, 3))
    prefixes.keep("t", [*a, 9], save)
    prefixes.keep("t", a, save)  # kept already: not saved again
    assert saved == [2 * BLOCK] and prefixes.held == 2 * BLOCK * 10
    prefixes.keep("t", [*a[:BLOCK], *b], save)  # 3 blocks: a's room is needed
    assert prefixes.held <= prefixes.budget and len(prefixes) == 1
    hit = prefixes.find("t", [*a[:BLOCK], *b, 7])
    assert hit is not None and hit.tokens == 3 * BLOCK
    # A prompt of whole blocks leaves its last block's tokens to prefill.
    hit = prefixes.find("t", [*a[:BLOCK], *b])
    assert hit is not None and hit.tokens == 2 * BLOCK
    hit = prefixes.find("t", [*a, 7])  # a's rows were dropped: only the first block is kept
    assert hit is not None and hit.tokens == BLOCK
    assert prefixes.find("other", [*a[:BLOCK], *b, 7]) is None
    prefixes.keep("t", c + [1] * BLOCK, save)  # too big for what is left: the oldest goes
    assert len(prefixes) == 1 and prefixes.find("t", [*c, *[1] * BLOCK, 0]) is not None
    prefixes.keep("t", [5] * (BLOCK + 3), save)  # one whole block: not worth keeping
    assert len(prefixes) == 1 and prefixes.held == 3 * BLOCK * 10


@pytest.mark.processes
def test_a_worker_reuses_a_tenants_instruction_and_counts_it(
    settings: Settings, make_app: Callable[..., Flask], database: Database, tmp_path: Path
) -> None:
    """Jobs through a real worker: the second of one tenant with the same system
    prompt is a hit; another tenant's same prompt is a miss; the answers are the
    same as they would be without."""
    own, model = own_chat_model(settings, tmp_path / "models", "prefixes")
    app = make_app(own)
    port = free_port()
    worker = WorkerProcess(own, tmp_path / "worker.log",
                           concurrency=1, DRAIN_LINGER_MS="0", WORKER_METRICS_PORT=str(port),
                           PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))  # fmt: skip
    client = app.test_client()
    one, other = make_tenant(database), make_tenant(database)
    texts = []
    try:
        for tenant, question in ((one, "Where is my refund?"), (one, "My chain fell off."),
                                 (other, "Where is my refund?")):  # fmt: skip
            body = {"model": model, "inputs": {"messages": [
                {"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]},
                "parameters": {"max_tokens": 8, "temperature": 0}}  # fmt: skip
            response = client.post("/jobs", json=body, headers=tenant.headers)
            assert response.status_code == 202, response.json
            job = wait_for_job(client, tenant.headers, response.json["id"], timeout=120)
            assert job["status"] == "succeeded", job
            texts.append(job["outputs"]["text"])
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        worker.stop()
    assert texts[0] == texts[2], "a kept prefix or not, the same answer"
    name = "inference_generation_prefix_lookups_total"
    lookups = {result: value(metrics, name, model=model, result=result)
               for result in ("hit", "miss")}  # fmt: skip
    assert lookups == {"hit": 1, "miss": 2}
    saved = value(metrics, "inference_generation_prefix_tokens_saved_total", model=model)
    assert saved >= 4 * BLOCK and saved % BLOCK == 0
