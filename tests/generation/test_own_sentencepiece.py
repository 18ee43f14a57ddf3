"""A GGUF file whose tokenizer is SentencePiece's BPE (Llama 2, Mistral, TinyLlama):
its text encoded as SentencePiece encodes it (checked against the algorithm as
llama.cpp runs it), its chat template over those pieces, its tokens streamed back
as text, and a chat job answered by a worker."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.cards import GenerationSpec
from app.generation.chat import ChatFormat
from app.generation.requests import parse
from app.runtime.tensors import InvalidInputs
from app.web.context import container_of
from modelbuild.gguf_file import read_gguf
from modelbuild.own_gguf import build_own_gguf
from tests.conftest import WorkerProcess, job_run
from tests.generation.tiny_gguf import MISTRAL, write_tiny

TEXTS = ["the are", " the  [INST]", "héllo </s> there", "Are the[/INST]", " ", "ℵ tthe he"]


def sentencepiece_ids(
    text: str, tokens: list[str], types: list[int], scores: list[float]
) -> list[int]:
    """SentencePiece's BPE as llama.cpp runs it: characters, then the adjacent pair
    whose joined piece (a normal one) scores highest merged, again and again (the
    leftmost of equals); a symbol with no piece is its UTF-8 bytes' tokens."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    symbols = list("\u2581" + text.replace(" ", "\u2581"))
    while True:
        best = None
        for at in range(len(symbols) - 1):
            joined = symbols[at] + symbols[at + 1]
            if joined in vocab and (best is None or scores[vocab[joined]] > best[0]):
                best = (scores[vocab[joined]], at)
        if best is None:
            break
        at = best[1]
        symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
    ids: list[int] = []
    for symbol in symbols:
        if symbol in vocab:
            ids.append(vocab[symbol])
        else:
            ids += [tokens.index(f"<0x{b:02X}>") for b in symbol.encode()]
    return ids


@pytest.fixture
def mistral(tmp_path: Path) -> tuple[ChatFormat, GenerationSpec, Path]:
    source = write_tiny(tmp_path / "spm.gguf", template=MISTRAL, bos="<s>", add_bos=True,
                        sentencepiece=True)  # fmt: skip
    spec = GenerationSpec.from_dict(build_own_gguf(source, tmp_path, "fp32")["generation"])
    return ChatFormat(tmp_path / "tokenizer.json", spec), spec, source


def test_text_is_encoded_as_sentencepiece_encodes_it_and_decoded_back(
    mistral: tuple[ChatFormat, GenerationSpec, Path],
) -> None:
    chat, spec, source = mistral
    _, _, tokenizer = read_gguf(source)
    tokens, types, scores = (list(tokenizer[k]) for k in ("tokens", "types", "scores"))
    for text in TEXTS:
        ids = chat.encode(parse(spec, {"prompt": text}, {"max_tokens": 4}))
        assert ids == [1, *sentencepiece_ids(text, tokens, types, scores)], text  # <s> first
        stream = chat.text_stream(())  # (the space put before the text taken off again)
        streamed = "".join(stream.add(t).text for t in ids[1:]) + stream.finish().text
        assert streamed == text
    assert tokens.index("</s>") not in chat.chat_ids((("user", "</s>"),))[:-1]


def test_a_mistral_template_over_sentencepiece_pieces(
    mistral: tuple[ChatFormat, GenerationSpec, Path],
) -> None:
    chat, spec, source = mistral
    _, _, tokenizer = read_gguf(source)
    vocabulary = [list(tokenizer[k]) for k in ("tokens", "types", "scores")]
    ids = chat.chat_ids((("user", "the are"), ("assistant", "the"), ("user", "are")))
    # The text between two control tokens encoded as one (with SentencePiece's space
    # before it, as Hugging Face's and llama.cpp's Llama tokenizers do after a control
    # token); the assistant's text follows `[/INST]` as the template writes it.
    assert ids == [1, *sentencepiece_ids("[INST] the are [/INST]the", *vocabulary), 2,
                   *sentencepiece_ids("[INST] are [/INST]", *vocabulary)]  # fmt: skip
    assert [chat.tokenizer.id_to_token(i) for i in ids[1:4]] == ["\u2581[", "INST", "]"]
    assert spec.stop_tokens == (2,) and spec.control == {"<s>": 1, "</s>": 2}
    with pytest.raises(InvalidInputs, match="roles must alternate"):
        chat.chat_ids((("system", "be brief"), ("user", "the")))


@pytest.mark.processes
def test_a_sentencepiece_model_answers_a_chat_job(
    app: Flask, client: FlaskClient, auth: dict[str, str], worker: WorkerProcess, tmp_path: Path
) -> None:
    plane = container_of(app)
    name = f"spm-{uuid.uuid4().hex[:8]}"
    source = write_tiny(tmp_path / "spm.gguf", template=MISTRAL, bos="<s>", add_bos=True,
                        sentencepiece=True)  # fmt: skip
    added = plane.models.add(source, name, weights="fp32")
    try:
        assert added.card.generation is not None
        body = {"model": name, "inputs": {"messages": [{"role": "user", "content": "the are"}]},
                "parameters": {"max_tokens": 5, "temperature": 0}}  # fmt: skip
        job = job_run(client, auth, body)
        assert job["status"] == "succeeded", job
        assert job["outputs"]["prompt_tokens"] == 10  # <s> [INST] the are [/INST]
        structured = {
            **body,
            "parameters": {
                "max_tokens": 40,
                "temperature": 0,
                "response_format": {"type": "json_object"},
            },
        }
        job = job_run(client, auth, structured)
        assert isinstance(json.loads(job["outputs"]["text"]), dict), job  # the guide's pieces
        refused = client.post("/jobs", json={**body, "inputs": {"messages": [
            {"role": "system", "content": "x"}, {"role": "user", "content": "the"}]}},
            headers=auth)  # fmt: skip
        assert refused.status_code == 422 and "roles must alternate" in refused.text
    finally:
        plane.models.remove(name)
