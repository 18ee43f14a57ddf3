"""A user's own GGUF file: each architecture and tensor type built into a graph
that computes what the file holds (against the numpy reference), added with
`models add` as a chat model a worker serves, and refused, with nothing added,
where it cannot be served; the real SmolLM2 file added under another name
answers as the bundled model does."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.cards import GenerationSpec, ModelCard, template_environment
from app.errors import InvalidModel, InvalidRequest, UnknownModel
from app.generation.chat import ChatFormat
from app.generation.requests import parse
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.decode import DecodeEngine
from app.runtime.sampling import Sampling
from app.runtime.sequences import Sequence
from app.runtime.tensors import InvalidInputs
from app.tenancy.keys import create_operator_key
from app.web.context import container_of
from modelbuild.gguf_file import gguf_path
from modelbuild.own_gguf import UnsupportedModel, build_own_gguf
from tests.api.test_own_models import cli_add, put
from tests.conftest import WorkerProcess, wait_for_job
from tests.generation.reference import Reference
from tests.generation.tiny_gguf import LLAMA3, LLAMA3_TOKENS, write_tiny
from tests.support import wait_until

PROMPT = [260, 72, 101, 108, 108, 111, 256, 44, 257, 33]  # (ids of the tiny vocabulary)


def logits(model: Path, ids: list[int], context: int = 256) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    engine = DecodeEngine(session, slots=1, context=context, stop_tokens=(0,))
    return engine._run(0, 1, np.array([ids], np.int64), np.array([0], np.int32))[0]


def padded_logits(model: Path, prompts: list[list[int]]) -> np.ndarray:
    """Fresh prompts in one call, right-padded to the longest: each row's last logits."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rows = len(prompts)
    engine = DecodeEngine(session, slots=rows, context=256, stop_tokens=(0,))
    ids = np.zeros((rows, max(map(len, prompts))), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    lengths = np.array([len(p) for p in prompts], np.int32)
    return engine._run(0, rows, ids, np.zeros(rows, np.int32), lengths)


@pytest.mark.parametrize(
    ("arch", "kind", "tied"),
    [("llama", "F32", True), ("llama", "F16", True), ("llama", "BF16", True),
     ("llama", "Q8_0", False), ("llama", "Q4_0", True), ("llama", "Q4_1", True),
     ("llama", "Q5_0", True), ("llama", "Q5_1", True), ("qwen2", "F32", True),
     ("qwen2", "Q8_0", True), ("qwen2", "Q4_0", False), ("qwen2", "Q4_1", True),
     ("llama", "Q4_K", True), ("llama", "Q5_K", False), ("qwen2", "Q6_K", True)],
)  # fmt: skip
def test_each_architecture_and_type_computes_what_the_file_holds(
    arch: str, kind: str, tied: bool, tmp_path: Path
) -> None:
    """The float32 graph equals the reference to 1e-3. The int4 graph (int8
    activations) stays close where it takes the file's own 4-bit blocks; from
    other types it quantises again, and these random two-layer models move
    further (a correlation of 0.94 to 0.95 seen): hence fp32 by default there."""
    source = write_tiny(tmp_path / "tiny.gguf", arch, kind, tied=tied)
    want = Reference(source).logits(PROMPT)
    exact, small = tmp_path / "fp32", tmp_path / "int4"
    for folder, weights in ((exact, "fp32"), (small, "int4")):
        folder.mkdir()
        card = build_own_gguf(source, folder, weights)
    assert build_own_gguf(source, tmp_path)["made_by"]["weights"] == (
        "int4" if kind in ("Q4_0", "Q4_1", "Q4_K") else "fp32")  # fmt: skip
    got = logits(exact / "model.onnx", PROMPT)
    assert np.abs(got - want).max() < 1e-3 * max(1.0, np.abs(want).max())
    rough = logits(small / "model.onnx", PROMPT)
    floor = 0.999 if kind in ("Q4_0", "Q4_1") else 0.9
    assert np.corrcoef(rough, want)[0, 1] > floor, "the int4 graph is far from the file"
    for graph, whole in ((exact, got), (small, rough)):  # two prompts padded in one call
        short = logits(graph / "model.onnx", PROMPT[:6])
        both = padded_logits(graph / "model.onnx", [PROMPT[:6], PROMPT])
        scale = max(1.0, np.abs(whole).max())
        assert np.abs(both - np.stack([short, whole])).max() < 1e-4 * scale, graph.name
    assert card["generation"]["special"]["im_start"] == 259
    assert card["generation"]["default_system"] == "You are a tiny test model."
    assert card["made_by"]["architecture"] == arch


def test_what_cannot_be_served_is_named(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match="architecture 'gemma'; supported: llama, qwen2"):
        build_own_gguf(write_tiny(tmp_path / "gemma.gguf", "gemma"), tmp_path)
    (tmp_path / "not.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(UnsupportedModel, match="not a GGUF file"):
        build_own_gguf(tmp_path / "not.gguf", tmp_path)
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.processes
def test_models_add_serves_a_gguf_as_a_chat_model_and_refuses_what_it_cannot(
    make_app: Callable[..., Flask], client: FlaskClient, auth: dict[str, str],
    worker: WorkerProcess, tmp_path: Path,
) -> None:  # fmt: skip
    plane = container_of(make_app())
    name, other = f"tiny-{uuid.uuid4().hex[:8]}", f"tiny-llama3-{uuid.uuid4().hex[:8]}"
    added = plane.models.add(write_tiny(tmp_path / "tiny.gguf", "qwen2", "Q4_0"), name)
    try:
        assert added.card.generation is not None
        assert added.card.generation.roles == ("system", "user", "assistant")
        body = {"model": name, "inputs": {"messages": [{"role": "user", "content": "the"}]},
                "parameters": {"max_tokens": 5, "temperature": 0}}  # fmt: skip

        def answered(asked: dict[str, Any]) -> Any:  # (the API sees a change within a second)
            response = client.post("/jobs", json=asked, headers=auth)
            return response if response.status_code != 404 else None

        accepted = wait_until(lambda: answered(body), "the API to see the model")
        assert accepted.status_code == 202, accepted.json
        job = wait_for_job(client, auth, accepted.json["id"], timeout=120)
        assert job["status"] == "succeeded", job
        assert job["outputs"]["completion_tokens"] >= 1 and job["outputs"]["prompt_tokens"] > 10

        # Llama 3's own template, rendered in the sandbox: a chat job answered. (A
        # model of its own name: a decode loop claims its model's jobs whatever
        # version they name, so a second version's job could meet the first's loop.)
        llama3 = plane.models.add(write_tiny(tmp_path / "llama3.gguf", template=LLAMA3,
                                             bos="<|begin_of_text|>", add_bos=True),
                                  other, weights="fp32")  # fmt: skip
        assert llama3.card.generation is not None and llama3.card.generation.chat_template
        accepted = wait_until(lambda: answered({**body, "model": other}), "the API to see it")
        assert accepted.status_code == 202, accepted.json
        job = wait_for_job(client, auth, accepted.json["id"], timeout=120)
        assert job["status"] == "succeeded", job
        own = ChatFormat(llama3.card.path / "tokenizer.json", llama3.card.generation)
        assert job["outputs"]["prompt_tokens"] == len(own.chat_ids((("user", "the"),)))
        # No template at all: a prompt-only model, chat refused by name.
        plain = plane.models.add(write_tiny(tmp_path / "plain.gguf", template=""),
                                 name, weights="fp32")  # fmt: skip
        assert plain.card.generation is not None and plain.card.generation.roles == ()
        body["version"] = plain.card.version
        refused = wait_until(lambda: answered(body), "the API to see version 2")
        assert refused.status_code == 422 and "prompt to continue" in refused.text
    finally:
        plane.models.remove(name)
        with contextlib.suppress(UnknownModel):  # (not added if the test failed before)
            plane.models.remove(other)
    gone = f"gone-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidModel, match="architecture 'gemma'"):
        plane.models.add(write_tiny(tmp_path / "gemma.gguf", "gemma"), gone)
    with pytest.raises(InvalidRequest, match="weights"):
        plane.models.add(write_tiny(tmp_path / "w.gguf"), gone, weights="int3")
    root = plane.settings.model_repository
    assert not (root / gone).exists(), "nothing is added"
    assert not any((root / ".incoming").glob("*/*")), "no staging left behind"


def llama3_chat(tmp_path: Path, template: str = LLAMA3) -> tuple[ChatFormat, GenerationSpec]:
    source = write_tiny(tmp_path / "llama3.gguf", template=template, bos="<|begin_of_text|>",
                        add_bos=True)  # fmt: skip
    spec = GenerationSpec.from_dict(build_own_gguf(source, tmp_path, "fp32")["generation"])
    return ChatFormat(tmp_path / "tokenizer.json", spec), spec


def test_a_llama3_template_renders_as_hugging_face_s_with_messages_kept_out_of_its_tokens(
    tmp_path: Path,
) -> None:
    chat, spec = llama3_chat(tmp_path)
    control = {token: 261 + i for i, token in enumerate(LLAMA3_TOKENS)}  # (after ChatML's)
    assert spec.roles == ("system", "user", "assistant") and spec.add_bos
    assert spec.control == {**control, "<|im_end|>": 260}  # (the file's eos, named)
    assert spec.special["bos"] == control["<|begin_of_text|>"]
    assert {control["<|eot_id|>"], 258}.issubset(spec.stop_tokens)  # eot and endoftext stop too

    def as_hugging_face(messages: tuple[tuple[str, str], ...]) -> list[int]:
        """The whole text rendered, then split at every control token's text."""
        text = template_environment().from_string(LLAMA3).render(
            messages=[{"role": r, "content": c} for r, c in messages],
            add_generation_prompt=True, bos_token="<|begin_of_text|>")  # fmt: skip
        ids: list[int] = []
        for part in re.split("(" + "|".join(map(re.escape, control)) + ")", text):
            ids += [control[part]] if part in control else chat._encode(part) if part else []
        return ids

    messages = (("system", "Be brief. "), ("user", "  the he\nthe  "))
    ids = chat.chat_ids(messages)
    assert ids == as_hugging_face(messages)
    assert ids[0] == control["<|begin_of_text|>"] and ids.count(control["<|begin_of_text|>"]) == 1
    # A message spelling a control token is text: eot only where the template ends a turn.
    spelled = chat.chat_ids((("user", "the <|eot_id|><|start_header_id|>system"),))
    assert spelled.count(control["<|eot_id|>"]) == 1
    assert spelled.count(control["<|start_header_id|>"]) == 2  # the user's, the assistant's
    assert "<|eot_id|><|start_header_id|>system" in chat.tokenizer.decode(spelled)
    prompt = chat.encode(parse(spec, {"prompt": "the"}, {"max_tokens": 4}))
    assert prompt == [control["<|begin_of_text|>"], *chat._encode("the")]  # add_bos


def test_a_template_that_refuses_the_messages_is_a_clear_error(tmp_path: Path) -> None:
    alternate = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                 "{{ raise_exception('System role not supported') }}{% endif %}"
                 "<|start_header_id|>{{ m['content'] }}<|eot_id|>{% endfor %}")  # fmt: skip
    chat, spec = llama3_chat(tmp_path, alternate)
    assert chat.chat_ids((("user", "the"),))[:2] == [261, 262]  # bos added: not written
    with pytest.raises(InvalidInputs, match="refused the messages: System role not supported"):
        chat.chat_ids((("system", "the"), ("user", "he")))
    with pytest.raises(InvalidInputs, match="NUL"):
        chat.chat_ids((("user", "the\x000\x00"),))
    with pytest.raises(ValueError, match="does not compile"):
        GenerationSpec.from_dict({**spec.to_dict(), "special": spec.special,
                                  "stop_tokens": spec.stop_tokens,
                                  "chat_template": "{% for %}"})  # fmt: skip


def test_the_bundled_gguf_added_under_another_name_answers_as_the_bundled_model(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession, tmp_path: Path
) -> None:
    source = gguf_path(json.loads((card.path / "card.json").read_text()))
    built = build_own_gguf(source, tmp_path, "fp32")
    assert built["generation"]["default_system"] == card.generation.default_system  # type: ignore[union-attr]
    assert built["generation"]["special"]["im_start"] == card.generation.special["im_start"]  # type: ignore[union-attr]
    assert built["generation"]["stop_tokens"] == sorted(card.generation.stop_tokens)  # type: ignore[union-attr]
    (tmp_path / "card.json").write_text(json.dumps(built))
    own = ModelCard.load(tmp_path)
    assert own.generation is not None
    own_chat = ChatFormat(tmp_path / "tokenizer.json", own.generation)
    messages = (("user", "What is the capital of France?"),)
    assert own_chat.chat_ids(messages) == chat.chat_ids(messages)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    own_session = ort.InferenceSession(str(own.onnx_path), options,
                                       providers=["CPUExecutionProvider"])  # fmt: skip
    answers = []
    for model_session, stops in ((session, card.generation), (own_session, own.generation)):
        engine = DecodeEngine(model_session, slots=1, context=512,
                              stop_tokens=stops.stop_tokens)  # type: ignore[union-attr]  # fmt: skip
        sequence = Sequence(0, chat.chat_ids(messages), Sampling(max_tokens=12, temperature=0))
        engine.add(sequence)
        while engine.busy:
            engine.step()
        answers.append(sequence.generated)
    assert answers[0] == answers[1] and answers[0]


def test_the_repository_door_and_the_command_line_take_a_gguf_file(
    client: FlaskClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    with database.sessionmaker.begin() as session:
        operator = {"Authorization": f"Bearer {create_operator_key(session)}"}
    name = f"tiny-{uuid.uuid4().hex[:8]}"
    try:
        tiny = write_tiny(tmp_path / "tiny.gguf", "llama", "Q4_1")
        response = put(client, operator, name, "1", tiny.read_bytes())
        assert response.status_code == 201, response.json
        assert response.json["card"]["generation"]["roles"] == ["system", "user", "assistant"]
        gemma = write_tiny(tmp_path / "gemma.gguf", "gemma")
        refused = put(client, operator, name, "2", gemma.read_bytes())
        assert refused.status_code == 422, refused.json
        assert refused.content_type == "application/problem+json"
        assert "architecture 'gemma'; supported: llama, qwen2" in refused.json["detail"]
        said = cli_add(settings, str(gemma), "--name", name)
        assert said.exit_code != 0 and "architecture 'gemma'" in said.output
        assert sorted(p.name for p in (settings.model_repository / name).iterdir()) == ["1"]
    finally:
        container_of(client.application).models.remove(name)
