"""Structured output, log-probabilities and the sampling controls on the decode
engine itself (real ONNX Runtime, the bundled chat model): what every door's
generation runs."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import onnxruntime as ort
import pytest

from app.cards import ModelCard
from app.generation.chat import ChatFormat
from app.generation.guides import Least, shortest
from app.generation.requests import GenerationRequest, parse
from app.runtime.decode import DecodeEngine
from app.runtime.labels import LabelScores, log_softmax
from app.runtime.sampling import Sampling, Seen, logprob_of, shape
from app.runtime.sequences import Sequence
from app.runtime.tensors import InvalidInputs
from tests.generation.schemas import CASES, PERSON, messages, response_format


def request(card: ModelCard, inputs: dict[str, Any], **parameters: Any) -> GenerationRequest:
    assert card.generation is not None
    return parse(card.generation, inputs, {"temperature": 0, **parameters})


def sequence(chat: ChatFormat, key: Any, asked: GenerationRequest) -> Sequence:
    return Sequence(key, chat.encode(asked), asked.sampling, chat.guide(asked))


def run_all(session: ort.InferenceSession, card: ModelCard, sequences: list[Sequence]) -> None:
    assert card.generation is not None
    engine = DecodeEngine(session, slots=16, context=1024, stop_tokens=card.generation.stop_tokens)
    pending = list(sequences)
    for _ in range(10_000):
        while pending and engine.room() > 0:
            engine.add(pending.pop(0))
        if not engine.busy:
            return
        engine.step()
    raise AssertionError("the engine did not finish")


def test_thirty_documents_under_ten_schemas_all_parse_and_validate(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    """Greedy, as a program extracting data would ask: every output is JSON that the
    schema accepts, ended by the grammar, not by max_tokens."""
    jobs = [(name, schema, document) for name, schema, documents in CASES
            for document in documents]  # fmt: skip
    sequences = [
        sequence(chat, i, request(card, {"messages": messages(document)}, max_tokens=200,
                                  response_format=response_format(name, schema)))
        for i, (name, schema, document) in enumerate(jobs)
    ]  # fmt: skip
    run_all(session, card, sequences)
    for (name, schema, document), made in zip(jobs, sequences, strict=True):
        text = chat.tokenizer.decode(made.generated)
        assert made.finish_reason == "stop", (name, document, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_gives_an_object_where_the_model_would_write_prose(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    inputs = {"messages": messages("John Smith is 42 years old.")}
    free = sequence(chat, 0, request(card, inputs, max_tokens=40))
    guided = sequence(chat, 1, request(card, inputs, max_tokens=40,
                                       response_format={"type": "json_object"}))  # fmt: skip
    run_all(session, card, [free, guided])
    with pytest.raises(json.JSONDecodeError):
        json.loads(chat.tokenizer.decode(free.generated))  # (it writes ```json fences)
    assert isinstance(json.loads(chat.tokenizer.decode(guided.generated)), dict)


def test_a_resumed_guided_sampled_run_equals_an_uninterrupted_one(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    """A retry goes on from the tokens recorded: its guide, penalties and seeded
    generator are where an uninterrupted run's were, so the rest is the same."""
    asked = request(card, {"messages": messages("Maria, aged 29, works as a nurse.")},
                    temperature=0.9, seed=7, max_tokens=60, frequency_penalty=0.5,
                    presence_penalty=0.3, response_format=response_format("p", PERSON))  # fmt: skip
    whole = sequence(chat, 0, asked)
    run_all(session, card, [whole])
    prompt = chat.encode(asked)
    resumed = Sequence.resumed(1, prompt, whole.generated[:6], asked.sampling, chat.guide(asked))
    run_all(session, card, [resumed])
    assert resumed.generated == whole.generated
    jsonschema.validate(json.loads(chat.tokenizer.decode(whole.generated)), PERSON)


def test_logit_bias_makes_and_bans_tokens(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    inputs = {"prompt": "The capital of France is"}
    plain = sequence(chat, 0, request(card, inputs, max_tokens=4))
    paris = chat.tokenizer.encode(" Paris").ids[0]
    banned = sequence(chat, 1, request(card, inputs, max_tokens=4, logit_bias={str(paris): -100}))
    forced = sequence(chat, 2, request(card, inputs, max_tokens=4, logit_bias={"1060": 100}))
    run_all(session, card, [plain, banned, forced])
    assert plain.generated[0] == paris
    assert paris not in banned.generated
    assert forced.generated == [1060] * 4


def test_the_penalties_are_openai_s_and_hugging_face_s_arithmetic() -> None:
    logits = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    sampling = Sampling(max_tokens=1, presence_penalty=0.5, frequency_penalty=0.25,
                        repetition_penalty=2.0, logit_bias=((2, 1.0),))  # fmt: skip
    seen = Seen([1], sampling)  # the prompt's token 1
    for token in (0, 0, 3):
        seen.add(token)
    got = shape(logits, sampling, seen)
    # token 0: 2 / 2 (repetition), then - 2*0.25 - 0.5; token 1 (prompt only): -1 * 2;
    # token 2: + 1 (bias); token 3: 3 / 2 - 0.25 - 0.5
    assert got.tolist() == pytest.approx([0.0, -2.0, 1.5, 0.75])
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0], "the model's row is left as it was"


def test_log_probabilities_are_the_row_s_log_softmax() -> None:
    row = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 3
    got = logprob_of(row, 17, 20)
    want = row.astype(np.float64) - np.log(np.sum(np.exp(row.astype(np.float64))))
    assert got.logprob == pytest.approx(want[17])
    values = [value for _, value in got.top]
    assert values == sorted(values, reverse=True) and len(values) == 20
    assert [token for token, _ in got.top] == list(np.argsort(-want)[:20])
    assert sum(np.exp(values)) <= 1.0


def test_the_engine_s_log_probabilities_are_its_picks_and_their_rivals(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    asked = request(card, {"prompt": "The capital of France is"}, max_tokens=5, logprobs=True,
                    top_logprobs=5)  # fmt: skip
    made = sequence(chat, 0, asked)
    assert card.generation is not None
    engine = DecodeEngine(session, slots=2, context=512, stop_tokens=card.generation.stop_tokens)
    engine.add(made)
    emitted = [item for _ in range(10) for item in engine.step() if item.token is not None]
    assert [item.token for item in emitted] == made.generated
    for item in emitted:
        assert item.logprob is not None and len(item.logprob.top) == 5
        assert item.logprob.top[0][0] == item.token  # greedy: the pick is the likeliest
        assert item.logprob.logprob == item.logprob.top[0][1] <= 0


@pytest.mark.parametrize(
    ("parameters", "field", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "object", "if": {}, "then": {}}, "strict": True}}},
         "response_format.json_schema.schema", '["if", "then"]'),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}}}},
         "response_format.json_schema.schema", "does not exist"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": []}}}},
         "response_format.json_schema.schema", "Unsatisfiable"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
        ({"top_logprobs": 3}, "top_logprobs", "needs logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 to 20"),
        ({"repetition_penalty": 0}, "repetition_penalty", "above 0"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ],
)  # fmt: skip
def test_bad_parameters_name_the_field_and_the_keyword(
    card: ModelCard, parameters: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidInputs) as caught:
        request(card, {"prompt": "hi"}, **parameters)
    assert words in caught.value.errors[field], caught.value.errors


def test_without_strict_a_keyword_not_supported_is_ignored_and_the_rest_enforced(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    schema = {**PERSON, "if": {"required": ["name"]}, "then": {}}
    lenient = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    made = sequence(chat, 0, request(card, {"messages": messages("Tom is 87.")}, max_tokens=60,
                                     response_format=lenient))  # fmt: skip
    run_all(session, card, [made])
    jsonschema.validate(json.loads(chat.tokenizer.decode(made.generated)), PERSON)


def test_the_shortest_answer_a_schema_allows() -> None:
    assert shortest(PERSON) == Least('{"name": "", "age": 0}', 0)
    pair = {"type": "array", "minItems": 2, "items": {"type": "string", "minLength": 30}}
    assert shortest(pair) == Least('["", ""]', 60)
    assert shortest({"type": "array", "minItems": 2, "items": {"enum": ["yes", "no"]}}) == (
        Least('["no", "no"]', 0)
    )
    assert shortest({"type": "string", "pattern": "a+"}) is None  # beyond the estimate


def test_max_tokens_is_refused_only_where_no_answer_could_fit(
    card: ModelCard, chat: ChatFormat
) -> None:
    """A string of at least 450 characters fits in 128 tokens of real words (the
    bound counts the vocabulary's longest tokens), but not in 10."""
    story = {"type": "object", "properties": {"story": {"type": "string", "minLength": 450}},
             "required": ["story"]}  # fmt: skip
    asked = {"response_format": response_format("story", story)}
    chat.encode(request(card, {"prompt": "Tell a story."}, max_tokens=128, **asked))
    with pytest.raises(InvalidInputs) as caught:
        chat.encode(request(card, {"prompt": "Tell a story."}, max_tokens=10, **asked))
    assert "450 characters at least" in caught.value.errors["max_tokens"]


SENTIMENT_LABELS = ["positive", "negative", "neutral"]
REVIEWS = ["I love this phone, the battery lasts for days!", "Absolutely wonderful experience!"]


def review(text: str) -> dict[str, Any]:
    ask = "Is the sentiment of this review positive, negative or neutral? Answer with one word."
    return {"messages": [{"role": "user", "content": f"{ask}\n\n{text}"}]}


def scored(chat: ChatFormat, key: Any, asked: GenerationRequest) -> Sequence:
    made = Sequence(key, chat.encode(asked), asked.sampling)
    labels = chat.label_ids(asked)
    assert labels is not None
    made.scores = LabelScores(labels)
    return made


def test_label_scores_are_the_labels_log_likelihoods_read_from_one_prefill(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    """Labels of one to three tokens, batched with each other's steps: each label's
    score equals its tokens' log-probabilities read by prefilling prompt + label
    afresh, and the probabilities sum to 1."""
    labels = ["very positive", "quite negative indeed", "neutral"]
    sequences = [scored(chat, i, request(card, review(text), labels=labels))
                 for i, text in enumerate(REVIEWS)]  # fmt: skip
    run_all(session, card, sequences)
    assert card.generation is not None
    one = DecodeEngine(session, slots=1, context=512, stop_tokens=())
    for made in sequences:
        assert made.scores is not None and made.finish_reason == "stop"
        assert sum(made.scores.probabilities()) == pytest.approx(1.0)
        assert [len(t) for t in made.scores.labels] == [2, 3, 1]
        for tokens, got in zip(made.scores.labels, made.scores.sums, strict=True):
            want = 0.0
            for j, token in enumerate(tokens):
                ids = np.array([made.prompt + tokens[:j]], np.int64)
                want += log_softmax(one._run(0, 1, ids, np.array([0], np.int32))[0])[token]
            assert got == pytest.approx(want, abs=1e-3)


def test_the_greedy_answer_s_label_scores_highest_on_clear_cases(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    for text in REVIEWS:
        made = scored(chat, 0, request(card, review(text), labels=SENTIMENT_LABELS))
        greedy = sequence(chat, 1, request(card, review(text), max_tokens=3))
        run_all(session, card, [made, greedy])
        assert made.scores is not None
        answer = chat.tokenizer.decode(greedy.generated).strip().lower()
        probabilities = made.scores.probabilities()
        assert SENTIMENT_LABELS[probabilities.index(max(probabilities))] == answer == "positive"


@pytest.mark.parametrize(
    ("labels", "field", "words"),
    [
        ([], "labels", "1 to 64"),
        (["yes", ""], "labels[1]", "non-empty"),
        (["yes", "no", "yes"], "labels[2]", "labels[0] too"),
        ("yes", "labels", "a list"),
    ],
)
def test_bad_labels_name_the_label(card: ModelCard, labels: Any, field: str, words: str) -> None:
    with pytest.raises(InvalidInputs) as caught:
        request(card, {"prompt": "hi"}, labels=labels)
    assert words in caught.value.errors[field], caught.value.errors


def test_choices_of_one_prompt_are_prefilled_once_and_decode_as_if_alone(
    card: ModelCard, chat: ChatFormat, session: ort.InferenceSession
) -> None:
    """n choices: the first prompt is prefilled, the others copy its cache rows and
    read its first logits; each then decodes what it would have alone."""
    asked = [request(card, {"prompt": "Once upon a time"}, temperature=1.0, seed=5 + i,
                     max_tokens=12) for i in range(3)]  # fmt: skip
    together = [sequence(chat, i, a) for i, a in enumerate(asked)]
    assert card.generation is not None
    engine = DecodeEngine(session, slots=4, context=512, stop_tokens=card.generation.stop_tokens)
    for made in together:
        engine.add(made)
    while engine.busy:
        engine.step()
    assert engine.prefill_calls == 1 and engine.shared == 2
    for i, a in enumerate(asked):
        alone = sequence(chat, i, a)
        run_all(session, card, [alone])
        assert alone.generated == together[i].generated
    assert len({tuple(s.generated) for s in together}) == 3


def test_labels_whose_tokens_would_hold_a_slot_too_long_are_refused(
    card: ModelCard, chat: ChatFormat
) -> None:
    """Each token after a label's first is a decode step in the request's slot:
    all of them together at most max_tokens, as a generation's."""
    labels = [f"{i} " + "a very long label of many words " * 6 for i in range(64)]
    with pytest.raises(InvalidInputs) as caught:
        chat.encode(request(card, {"prompt": "Pick one."}, labels=labels))
    assert "at most 2048" in caught.value.errors["labels"]
