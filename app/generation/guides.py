"""Structured output: a JSON schema every generated token is checked against.

A request's `response_format` (OpenAI's shape: `{"type": "json_object"}`, or
`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`) becomes
a grammar, and each decode step masks the tokens it forbids next
(app.runtime.decode.Guide), so the output always parses and matches the schema;
it ends the moment the JSON is whole. The JSON is on one line, written as
Python's json.dumps writes it (`, ` and `: `, the form models saw most): a small
model given room for whitespace can spend its tokens on it.

A grammar alone does not make an answer whole: a small model can go on inside a
string or a number until max_tokens cuts it. So when the tokens left come down
to what the shortest answer takes (plus a margin), the guide closes: inside a
string, wherever the grammar allows a token that begins with the closing quote,
only such tokens are allowed; outside, only tokens of closing brackets, where
allowed. The answer ends well-formed (with short values) rather than cut off.

The grammar engine is llguidance: it has no dependencies (no torch: xgrammar's
package needs torch, transformers and triton), computes a mask on the fly in
tens of microseconds against SmolLM2's 49,152 tokens with nothing built per
schema ahead of the first token (outlines-core builds an index over the whole
vocabulary per schema first), and its errors name the keyword it cannot honour.
With `strict: true` a keyword it does not implement is refused; without, it is
ignored (a warning) and the rest is still enforced.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from app.runtime.tensors import InvalidInputs

if TYPE_CHECKING:  # (a TypedDict of the stubs only)
    from llguidance._lib import JsonCompileOptions

FIELD = "response_format"
_COMPACT: JsonCompileOptions = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "
}  # fmt: skip
CLOSING_MARGIN = 8  # tokens beyond the shortest answer's at which a guide starts closing
_MAX_SCHEMA_BYTES = 64 * 1024


@dataclass(frozen=True)
class Constraint:
    """What the output must be: a JSON value matching `schema` (any JSON object
    for json_object)."""

    schema: dict[str, Any]
    strict: bool = True
    name: str = "response"

    def grammar(self) -> str:
        options: JsonCompileOptions = {**_COMPACT, "lenient": not self.strict}
        return str(LLMatcher.grammar_from_json_schema(self.schema, defaults=options))

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "strict": self.strict, "name": self.name}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Constraint:
        return cls(raw["schema"], bool(raw["strict"]), str(raw["name"]))


def response_format(raw: Any, field: str = FIELD) -> Constraint | None:
    """OpenAI's `response_format` as a Constraint (None for `{"type": "text"}`);
    InvalidInputs names what is wrong, down to a schema keyword not supported."""
    expected = ('{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                '"json_schema": {"name": ..., "schema": {...}, "strict": true}}')  # fmt: skip
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidInputs({field: f"expected {expected}"})
    kind = raw["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return checked(Constraint({"type": "object"}, strict=True, name="json_object"), field)
    spec = raw.get("json_schema")
    where = f"{field}.json_schema"
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidInputs({where: 'expected {"name": ..., "schema": {...}, "strict": true}'})
    strict = spec.get("strict", False)
    if not isinstance(strict, bool):
        raise InvalidInputs({f"{where}.strict": "expected true or false"})
    name = spec.get("name", "response")
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        raise InvalidInputs({f"{where}.name": "expected a name of 1 to 64 characters"})
    return checked(Constraint(spec["schema"], strict, name), f"{where}.schema")


def checked(constraint: Constraint, field: str) -> Constraint:
    """The constraint, once its schema compiles; InvalidInputs names the problem
    (a keyword not supported, a pointer that leads nowhere, an empty enum...)."""
    if len(json.dumps(constraint.schema)) > _MAX_SCHEMA_BYTES:
        raise InvalidInputs({field: f"a schema of at most {_MAX_SCHEMA_BYTES} bytes of JSON"})
    try:
        grammar = constraint.grammar()
    except ValueError as exc:
        raise InvalidInputs({field: f"not a JSON schema: {exc}"}) from None
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        problem = messages[0] if messages else "it does not compile"
        if problem.startswith("Unimplemented keys"):
            problem += " (not supported here; leave them out, or send strict: false to ignore them)"
        raise InvalidInputs({field: problem})
    return constraint


class Grammars:
    """A tokenizer's guides: made once per model version and process (0.2 s).
    `control`: the control tokens' ids and texts, which the grammar must know as
    such (the model's tokenizer.json holds them as plain vocabulary, the chat
    format inserting them by id), else `<|im_end|>` would pass for the ten
    characters it spells inside a JSON string, and end it there."""

    def __init__(
        self, tokenizer_json: str, control: dict[int, str], stop_tokens: tuple[int, ...],
        vocab: int,
    ) -> None:  # fmt: skip
        spec = json.loads(tokenizer_json)
        known = {entry["id"] for entry in spec.get("added_tokens") or []}
        spec["added_tokens"] = [*(spec.get("added_tokens") or []), *(
            {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, text in control.items() if i not in known)]  # fmt: skip
        self._tokenizer = LLTokenizer(json.dumps(spec), n_vocab=vocab,
                                      eos_token=list(stop_tokens))  # fmt: skip
        self.vocab = vocab
        # The tokens that close: inside a string, a quote first (`"`, `"}`, `"]}`...);
        # outside, brackets only. Which applies follows the text (JsonGuide).
        self.pieces = [self._tokenizer.decode_bytes([t]) for t in range(vocab)]
        self.ends_string = np.zeros(vocab, bool)
        self.ends_container = np.zeros(vocab, bool)
        for token, piece in enumerate(self.pieces):
            text = piece.strip()
            self.ends_string[token] = piece.startswith(b'"') and not piece.strip(b'"]} ')
            self.ends_container[token] = bool(text) and not text.strip(b"]}")

    def guide(self, constraint: Constraint, reserve: int) -> JsonGuide:
        """A sequence's guide, closing once `reserve` tokens are left."""
        matcher = LLMatcher(self._tokenizer, constraint.grammar(), log_level=0)
        if matcher.is_error():
            raise InvalidInputs({FIELD: matcher.get_error()})
        return JsonGuide(matcher, self, reserve)


KEPT_GRAMMARS = 4  # tokenizers whose tables a process keeps (the most recently used)
_kept: OrderedDict[str, Grammars] = OrderedDict()
_kept_lock = threading.Lock()


def grammars_for(
    tokenizer_json: str, control: dict[int, str], stop_tokens: tuple[int, ...], vocab: int
) -> Grammars:
    """One Grammars per tokenizer in a process, shared by the versions of a model
    (a version rolled or added again keeps them: nothing is made again or grows)."""
    named = [tokenizer_json, sorted(control.items()), list(stop_tokens), vocab]
    key = hashlib.sha256(json.dumps(named).encode()).hexdigest()
    with _kept_lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
        made = _kept[key] = Grammars(tokenizer_json, control, stop_tokens, vocab)
        while len(_kept) > KEPT_GRAMMARS:
            _kept.popitem(last=False)
        return made


class JsonGuide:
    """One sequence's grammar state (app.runtime.decode.Guide), and whether its
    text stands inside a string (which tokens close it)."""

    def __init__(self, matcher: LLMatcher, grammars: Grammars, reserve: int) -> None:
        self._matcher, self._grammars, self.reserve = matcher, grammars, reserve
        self._bits = np.zeros((grammars.vocab + 31) // 32, np.int32)
        self._in_string = self._escaped = False

    def mask(self, logits: np.ndarray, left: int) -> np.ndarray:
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        allowed = allowed[: logits.size].astype(bool)
        if left <= self.reserve and not self._escaped:
            grammars = self._grammars
            ending = grammars.ends_string if self._in_string else grammars.ends_container
            closing = allowed & ending[: logits.size]
            if closing.any():
                allowed = closing
        return np.where(allowed, logits, np.float32(-np.inf))

    def accept(self, token: int) -> None:
        self._matcher.consume_token(token)
        if token < len(self._grammars.pieces):
            for byte in self._grammars.pieces[token]:
                if self._escaped:
                    self._escaped = False
                elif byte == 0x5C and self._in_string:  # a backslash
                    self._escaped = True
                elif byte == 0x22:  # a quote
                    self._in_string = not self._in_string

    @property
    def finished(self) -> bool:
        return bool(self._matcher.is_stopped())


@dataclass(frozen=True)
class Least:
    """The shortest answer a schema plainly allows: its JSON as the guide writes
    it, strings empty, and the characters its strings must hold besides."""

    text: str
    chars: int


def shortest(schema: dict[str, Any]) -> Least | None:
    """The shortest answer the schema plainly allows (its required properties,
    its arrays' least items, its strings' least characters), to tell a request
    whose max_tokens cannot hold any answer; None where the schema is beyond this
    estimate (allOf, patterns, recursion too deep)."""
    chars = [0]
    try:
        value = _least(schema, schema, 0, chars)
    except _Unknown:
        return None
    return Least(json.dumps(value, separators=(", ", ": "), ensure_ascii=False), chars[0])


class _Unknown(Exception):
    pass


def _least(node: Any, root: dict[str, Any], depth: int, chars: list[int]) -> Any:
    if depth > 16 or not isinstance(node, dict):
        raise _Unknown
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _Unknown
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            if not isinstance(target, dict) or part not in target:
                raise _Unknown
            target = target[part]
        return _least(target, root, depth + 1, chars)
    if "const" in node:
        return node["const"]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return min(node["enum"], key=lambda v: len(json.dumps(v, separators=(",", ":"))))
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key]:
            options = []
            for option in node[key]:
                try:
                    options.append(_least(option, root, depth + 1, [0]))
                except _Unknown:
                    continue
            if not options:
                raise _Unknown
            return min(options, key=lambda v: len(json.dumps(v, separators=(",", ":"))))
    if "allOf" in node or "pattern" in node or "format" in node:
        raise _Unknown
    kind = node.get("type", "object" if "properties" in node else None)
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if kind == "object":
        properties = node.get("properties") or {}
        return {name: _least(properties.get(name, {"type": "null"}), root, depth + 1, chars)
                for name in node.get("required") or ()}  # fmt: skip
    if kind == "array":
        count, before = int(node.get("minItems", 0)), chars[0]
        item = _least(node.get("items") or {"type": "null"}, root, depth + 1, chars)
        chars[0] = before + (chars[0] - before) * count
        return [item] * count
    if kind == "string":
        chars[0] += int(node.get("minLength", 0))
        return ""
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum"))
        return 0 if low is None or low <= 0 else int(low) + 1
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    raise _Unknown
