"""Prompts to token ids (the ChatML template, or the model's own: app.generation.
templates) and token ids back to text.

Control tokens (`<|im_start|>`, `<|im_end|>`) are inserted by id; everything a
client wrote is encoded by a BPE that knows no added tokens (byte-level, or
SentencePiece's with byte fallback), so a message that spells `<|im_end|>` is
those characters, never the control token.
The segments between control tokens are encoded as Hugging Face's tokenizer
encodes them (the role, a newline and the content as one piece), so the ids
equal the model's own template's.

`TextStream` turns the tokens of one sequence into text as they come: it never
emits half a UTF-8 character, and it holds back a tail that could still become
a stop sequence, so streamed text never shows a stop sequence, and joined it
equals the final text.
"""

from __future__ import annotations

import codecs
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders

from app.cards import GenerationSpec
from app.generation.guides import (
    CLOSING_MARGIN,
    Grammars,
    JsonGuide,
    Least,
    grammars_for,
    shortest,
)
from app.generation.requests import GenerationRequest
from app.generation.templates import ChatTemplate
from app.runtime.sampling import TokenLogprob
from app.runtime.tensors import InvalidInputs


def _byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_BYTE_OF = _byte_level()
_BYTE_PIECE = re.compile("<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


class ChatFormat:
    def __init__(self, tokenizer_path: Path, spec: GenerationSpec) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.spec = spec
        self.vocab = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        self._newline = self._encode("\n")
        self._grammars: Grammars | None = None
        self._lock = threading.Lock()
        self._special = set(spec.special.values()) | set(spec.control.values())
        self._byte_level = isinstance(self.tokenizer.decoder, decoders.ByteLevel)
        self._bytes: dict[int, bytes] = {}
        self._longest = 0  # the longest token's bytes (read on first need)
        self._template = ChatTemplate.of(spec)  # (None: ChatML by its control tokens)
        self._bos = [spec.special["bos"]] if spec.add_bos else []

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def prompt_of(self, request: GenerationRequest) -> list[int]:
        """The prompt's ids a worker runs: those the API measured when the request
        was submitted (this version's tokenizer too), else encoded here."""
        if request.prompt_ids:
            return list(request.prompt_ids)
        return self.encode(request)

    def encode(self, request: GenerationRequest) -> list[int]:
        """The prompt's ids; InvalidInputs when they and max_tokens overrun the context."""
        if request.messages is None:
            ids = [*self._bos, *self._encode(request.prompt or "")]
        else:
            ids = self.chat_ids(request.messages)
        context, wanted = self.spec.context_length, request.sampling.max_tokens
        if len(ids) + wanted > context:
            raise InvalidInputs({
                "messages" if request.messages is not None else "prompt":
                f"the prompt is {len(ids)} tokens and max_tokens {wanted}: together at most "
                f"{context}, this model's context; shorten the prompt or lower max_tokens"
            })  # fmt: skip
        if unknown := [t for t, _ in request.sampling.logit_bias if t >= self.vocab]:
            raise InvalidInputs({"logit_bias": f"token id(s) {unknown} are not in this model's "
                                 f"vocabulary (0 to {self.vocab - 1})"})  # fmt: skip
        self.label_ids(request)  # (the labels fit)
        if request.constraint is not None:
            least = shortest(request.constraint.schema)
            if least is not None and (n := self._least_tokens(least)) > wanted:
                holding = f", its strings {least.chars} characters at least" if least.chars else ""
                raise InvalidInputs({"max_tokens": (
                    f"the shortest answer the response format allows ({least.text}{holding}) "
                    f"takes {n} tokens or more, more than max_tokens {wanted}; "
                    "raise max_tokens")})  # fmt: skip
        return ids

    def _least_tokens(self, least: Least) -> int:
        """Tokens the shortest answer takes at least: its JSON's, and its strings'
        characters in tokens as long as the longest of the vocabulary (a bound
        that never refuses an answer that could fit)."""
        if self._longest == 0:  # (byte-level: a character of a token's name is a byte)
            self._longest = max(len(name) for name in self.tokenizer.get_vocab())
        return len(self._encode(least.text)) + -(-least.chars // self._longest)

    def label_ids(self, request: GenerationRequest) -> list[list[int]] | None:
        """The candidate labels' tokens, as the answer would begin with them."""
        if request.labels is None:
            return None
        labels = [self._encode(label) for label in request.labels]
        if (fed := sum(len(tokens) - 1 for tokens in labels)) > self.spec.max_tokens:
            # (each token after a label's first is a decode step holding the slot)
            raise InvalidInputs(
                {
                    "labels": f"the labels' tokens after their first are {fed}, "
                    f"at most {self.spec.max_tokens} (this model's max_tokens)"
                }
            )
        return labels

    def guide(self, request: GenerationRequest) -> JsonGuide | None:
        """The request's grammar state, when its output is constrained."""
        if request.constraint is None:
            return None
        least = shortest(request.constraint.schema)
        reserve = self._least_tokens(least) if least is not None else 2 * CLOSING_MARGIN
        return self.grammars().guide(request.constraint, reserve + CLOSING_MARGIN)

    def grammars(self) -> Grammars:
        """The guides' tables of this tokenizer, made on first need (0.4 s: a decode
        loop has them made as it starts, so a first schema does not wait)."""
        with self._lock:
            if self._grammars is None:
                control = {i: self.tokenizer.id_to_token(i) or "" for i in self._special}
                self._grammars = grammars_for(self.tokenizer.to_str(), control,
                                              self.spec.stop_tokens, self.vocab)  # fmt: skip
            return self._grammars

    def chat_ids(self, messages: tuple[tuple[str, str], ...]) -> list[int]:
        if self._template is not None:
            return self._template.ids(messages, self._encode)
        start, end = self.spec.special["im_start"], self.spec.special["im_end"]
        turns = list(messages)
        if self.spec.default_system is not None and turns[0][0] != "system":
            turns.insert(0, ("system", self.spec.default_system))
        ids: list[int] = []
        for role, content in turns:
            ids += [start, *self._encode(f"{role}\n{content}"), end, *self._newline]
        return [*ids, start, *self._encode("assistant\n")]

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes (a byte-level token, or a SentencePiece byte token, may
        hold part of a character; SentencePiece writes a space as `▁`)."""
        found = self._bytes.get(token)
        if found is None:
            piece = self.tokenizer.id_to_token(token) or ""
            if token in self._special:
                found = piece.encode()
            elif self._byte_level:
                found = bytes(_BYTE_OF.get(ch, 0x3F) for ch in piece)
            elif byte := _BYTE_PIECE.fullmatch(piece):
                found = bytes([int(byte.group(1), 16)])
            else:
                found = piece.replace("\u2581", " ").encode()
            self._bytes[token] = found
        return found

    def logprob_entry(self, logprob: TokenLogprob) -> dict[str, Any]:
        """A token's log-probability as OpenAI's chat `logprobs.content` item."""

        def item(token: int, value: float) -> dict[str, Any]:
            raw = self.token_bytes(token)
            return {"token": storable(raw.decode("utf-8", errors="replace")),
                    "bytes": list(raw), "logprob": value}  # fmt: skip

        return {**item(logprob.token, logprob.logprob),
                "top_logprobs": [item(t, v) for t, v in logprob.top]}  # fmt: skip

    def text_stream(self, stop: tuple[str, ...]) -> TextStream:
        # (SentencePiece's decoder drops the one space it puts before a text)
        return TextStream(self.token_bytes, stop, strip_space=not self._byte_level)


def storable(text: str) -> str:
    """Generated text as PostgreSQL stores it: U+0000 as U+FFFD, as bytes that make
    no character come out. A model can make byte 0 (a prompt or a `logit_bias`
    can ask for it), and a text or jsonb value cannot hold it: the write of the
    loop's pieces would fail, and with it every generation of the loop."""
    return text.replace("\x00", "\ufffd")


@dataclass
class Piece:
    text: str  # new text, safe to show
    stopped: bool  # a stop sequence was met: the sequence ends here


class TextStream:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: tuple[str, ...],
                 strip_space: bool = False) -> None:  # fmt: skip
        self._bytes = token_bytes
        # Tokens as bytes, decoded as they come: a character split over tokens is
        # held until whole; bytes that can never make one come out as U+FFFD.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = strip_space
        self._decoded = ""
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # all text so far, stop sequence excluded
        self._sent = 0  # characters of it already emitted

    def add(self, token: int) -> Piece:
        piece = storable(self._utf8.decode(self._bytes(token)))
        if not piece:  # (part of a character: wait for the rest)
            return Piece("", False)
        if self._strip:
            piece, self._strip = piece.removeprefix(" "), False
        self._decoded += piece
        decoded = self.text = self._decoded
        for stop in self._stop:
            at = decoded.find(stop, max(0, self._sent - len(stop)))
            if at >= 0:
                self.text = decoded[:at]
                return self._emit(len(self.text), True)
        return self._emit(max(self._sent, len(decoded) - self._hold), False)

    def finish(self) -> Piece:
        """The held-back tail, once the sequence ended without a stop sequence."""
        if tail := storable(self._utf8.decode(b"", final=True)):  # (a character unfinished)
            self._decoded += tail
            self.text = self._decoded
        return self._emit(len(self.text), False)

    def _emit(self, upto: int, stopped: bool) -> Piece:
        piece = self.text[self._sent : upto]
        self._sent = max(self._sent, upto)
        return Piece(piece, stopped)
