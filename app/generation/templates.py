"""A model's own chat template (a GGUF file's `tokenizer.chat_template`: Jinja, as
Hugging Face's `apply_chat_template` renders it) turned into token ids, with what
a client wrote kept out of the control tokens.

The template is rendered in Jinja's immutable sandbox (no attribute access to
Python internals, no mutation of what it is given, ranges bounded) with each
message's content replaced by a placeholder; only the template's own text is
searched for control tokens (`<|start_header_id|>`, `<|eot_id|>`...), inserted
by id. The placeholders then take the messages' text back, and each run of text
between two control tokens (the template's text and a message's, together) is
encoded by the model's BPE, which knows no control tokens: a message that spells
`<|eot_id|>` is those characters, and the ids otherwise equal those of Hugging
Face's rendering (which searches the whole text, messages included). A template
that trims a message's content (`message['content'] | trim`, Llama 3's) has it
trimmed here before it is put back. A template that reads the content itself
(`'</think>' in content`) sees the placeholder: such branches are not taken.

The template comes with the model (its card), not with a request; a call only
chooses the roles and the text, which no rendering can run as template code. It
may come from anywhere (a GGUF file a user downloaded), so one rendering is
bounded in time and size (app.cards.template_environment, `_rendered`): a
template that would hold the API's threads or a decode loop is refused instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from jinja2 import TemplateError

from app.cards import (
    GenerationSpec,
    TemplateRefused,
    TimedList,
    on_time,
    rendering,
    template_environment,
)
from app.runtime.tensors import InvalidInputs

_PLACEHOLDER = re.compile("\x00([0-9]+)\x00")  # (a message holding NUL is refused)
_TRIMS = re.compile(r"""content['"]?\]?\s*\|\s*trim""")

# (a token is seldom over 16 characters: a template that writes more than this per
# position of the context makes a prompt that could not fit it)
CHARS_PER_POSITION = 64

Encode = Callable[[str], list[int]]


class ChatTemplate:
    def __init__(self, source: str, control: dict[str, int], names: dict[str, str],
                 bos: int | None, context: int = 8192) -> None:  # fmt: skip
        """`control`: the control tokens' text and ids; `names`: the template's
        variables bos_token and eos_token; `bos`: the id prepended when the model asks
        for one and the template did not write it; `context`: the model's positions
        (the template's text for one request is at most CHARS_PER_POSITION a position)."""
        self._template = template_environment().from_string(source)
        self._most = context * CHARS_PER_POSITION
        self._trims = _TRIMS.search(source) is not None
        self._control = control
        self._names = names
        self._bos = bos
        words = sorted(control, key=len, reverse=True)  # (the longest first)
        self._find = re.compile("|".join(map(re.escape, words))) if words else None

    def ids(self, messages: Sequence[tuple[str, str]], encode: Encode) -> list[int]:
        """The prompt's ids, the template's generation prompt at its end; InvalidInputs
        naming `messages` when the template refuses them."""
        for i, (_, content) in enumerate(messages):
            if "\x00" in content:
                raise InvalidInputs({f"messages[{i}].content": "a NUL character; text only"})
        texts = [content.strip() if self._trims else content for _, content in messages]
        shown = TimedList({"role": role, "content": f"\x00{i}\x00"}
                          for i, (role, _) in enumerate(messages))  # fmt: skip
        try:
            rendered = self._rendered(shown)
        except (TemplateRefused, TemplateError) as exc:
            raise InvalidInputs({"messages": f"this model's chat template refused the "
                                 f"messages: {exc}"}) from None  # fmt: skip
        except Exception as exc:  # its own failure (1/0, a range too big...), not the service's
            raise InvalidInputs({"messages": f"this model's chat template failed on the "
                                 f"messages: {type(exc).__name__}: {exc}"}) from None  # fmt: skip
        ids: list[int] = []
        text: list[str] = []  # the run of text since the last control token
        for at, part in enumerate(_PLACEHOLDER.split(rendered)):
            if at % 2:  # a placeholder's index
                text.append(texts[int(part)])
                continue
            start = 0
            for found in self._find.finditer(part) if self._find else ():
                text.append(part[start : found.start()])
                ids += self._encoded(text, encode)
                ids.append(self._control[found.group()])
                start = found.end()
            text.append(part[start:])
        ids += self._encoded(text, encode)
        if self._bos is not None and ids[:1] != [self._bos]:
            ids.insert(0, self._bos)
        return ids

    def _rendered(self, shown: TimedList) -> str:
        """The template's text for these messages, within TEMPLATE_SECONDS and at most
        `_most` characters (more could not fit the context): checked as it comes,
        so a template cannot hold a thread or fill its memory first."""
        parts, left = [], self._most
        with rendering():
            for part in self._template.generate(messages=shown, add_generation_prompt=True,
                                                **self._names):  # fmt: skip
                left -= len(part)
                if left < 0:
                    raise TemplateRefused(f"it wrote more than {self._most} characters")
                parts.append(part)
                on_time()
        return "".join(parts)

    @classmethod
    def of(cls, spec: GenerationSpec) -> ChatTemplate | None:
        """The card's template (None: it has none, its roles are ChatML's)."""
        if spec.chat_template is None:
            return None
        text_of = {i: word for word, i in spec.control.items()}
        names = {f"{name}_token": text_of.get(spec.special[name], "")
                 for name in ("bos", "eos") if name in spec.special}  # fmt: skip
        bos = spec.special.get("bos") if spec.add_bos else None
        return cls(spec.chat_template, spec.control, names, bos, spec.context_length)

    @staticmethod
    def _encoded(text: list[str], encode: Encode) -> list[int]:
        joined = "".join(text)
        text.clear()
        return encode(joined) if joined else []
