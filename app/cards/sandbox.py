"""The sandbox a chat template from a model's file renders in: bounded in time and
size, so a GGUF from anywhere cannot hold an API thread or a decode loop, nor
fill its memory (app.generation.templates renders in it)."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any


class TemplateRefused(Exception):
    """A chat template raised (`raise_exception`: roles out of its order, say), or
    went past what one rendering may take (TEMPLATE_SECONDS, TEMPLATE_ITEMS)."""


# A model's template comes from its file (a GGUF from anywhere); one request's
# rendering, on the API's threads and the decode loop, may take this much at most.
TEMPLATE_SECONDS = 0.5
TEMPLATE_ITEMS = 100_000  # a sequence its `*` makes, a number a call takes (as Jinja's ranges)
_DEADLINE: ContextVar[float] = ContextVar("template_deadline", default=float("inf"))


def _refuse(message: str) -> None:
    raise TemplateRefused(message)


def on_time() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise TemplateRefused(f"the chat template ran past {TEMPLATE_SECONDS:g} s")


class TimedList(list[Any]):
    """A list a template iterates under the rendering's deadline (a loop in a loop
    over the messages, with nothing written, would else run unchecked)."""

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            on_time()
            yield item

    def __getitem__(self, index: Any) -> Any:
        got = super().__getitem__(index)
        return TimedList(got) if isinstance(index, slice) else got


@contextmanager
def rendering() -> Iterator[None]:
    """The deadline of one rendering (TEMPLATE_SECONDS from now)."""
    token = _DEADLINE.set(time.monotonic() + TEMPLATE_SECONDS)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def template_environment() -> Any:
    """Jinja's immutable sandbox as Hugging Face renders chat templates in it: no
    access to Python's internals, nothing it is given changed, ranges bounded; and
    bounded here in time (ranges and TimedList checked against `rendering`'s
    deadline) and in size (`*`, `**` and `%` checked, so not folded at compile time:
    a template's `'x' * 10**9` took 23 s and 1 GB to compile; calls' and filters'
    numbers and format widths checked before the call)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _bounded(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(__obj, "__name__", "") in ("format", "format_map"):
                _widths(getattr(getattr(__obj, "__wrapped__", __obj), "__self__", ""))
            _sizes(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    def timed_range(*args: int) -> TimedList:
        return TimedList(safe_range(*args))

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters = {name: _sized_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _refuse
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["range"] = timed_range
    return env


def _sizes(args: Any, kwargs: dict[str, Any]) -> None:
    """TemplateRefused for an integer argument past TEMPLATE_ITEMS: a width, a count
    or a length (`'x'.ljust(10**9)`, `|center(10**9)`) would make a string that long."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > TEMPLATE_ITEMS:
            _refuse(f"the chat template passes {value}, more than {TEMPLATE_ITEMS}, to a call")


def _widths(text: Any) -> None:
    """TemplateRefused for a format string with a width of seven digits or more."""
    if isinstance(text, str) and re.search(r"[0-9]{7,}", text):
        _refuse("the chat template formats with a width of more than six digits")


def _sized_filter(name: str, f: Any) -> Any:
    """A filter whose arguments past the value are bounded as a call's (`format`'s
    value, a format string, too)."""
    at = 1 if getattr(f, "jinja_pass_arg", None) else 0  # (the value's place)

    @functools.wraps(f)
    def sized(*args: Any, **kwargs: Any) -> Any:
        _sizes(args[at + 1 :], kwargs)
        if name == "format" and len(args) > at:
            _widths(args[at])
        return f(*args, **kwargs)

    return sized


def _bounded(operator: str, left: Any, right: Any) -> None:
    """TemplateRefused for a `*` making a sequence longer than TEMPLATE_ITEMS, a `**`
    making an integer of more than a million bits, or a `%` format too wide."""
    if operator == "%" and isinstance(left, str):  # (a format; an integer's modulo is none)
        _widths(left)
        _sizes(right if isinstance(right, tuple) else (right,), {})
    elif operator == "*":
        for items, times in ((left, right), (right, left)):
            if (isinstance(items, str | list | tuple) and isinstance(times, int)
                    and len(items) * times > TEMPLATE_ITEMS):  # fmt: skip
                _refuse(f"the chat template makes a sequence of more than {TEMPLATE_ITEMS} items")
    elif (operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0
          and max(left.bit_length(), 1) * right > 1_000_000):  # fmt: skip
        _refuse("the chat template makes an integer of more than a million bits")


def check_template(source: str) -> None:
    """ValueError when a card's chat template is not a Jinja template."""
    from jinja2 import TemplateError

    try:
        template_environment().from_string(source)
    except TemplateError as exc:
        raise ValueError(f"generation.chat_template does not compile: {exc}") from None
