"""A model's chat template comes from its file, which may come from anywhere: one
rendering is bounded in time and size, so a template cannot hold the API's
threads, a decode loop or their memory; it is refused with a clear error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from app.cards import TEMPLATE_SECONDS, check_template
from app.generation.templates import CHARS_PER_POSITION, ChatTemplate
from app.runtime.tensors import InvalidInputs

CONTEXT = 256
LIVENESS_S = 60.0  # many times the bound: a template unbounded again fails, not hangs


def encode(text: str) -> list[int]:
    return list(text.encode())


def within_liveness(call: Callable[[], Any]) -> Any:
    """call() in a thread; its result, or the exception it raised. A call still
    running after LIVENESS_S fails the test (the thread is left to the process)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIVENESS_S)
    assert not thread.is_alive(), f"still rendering after {LIVENESS_S:g} s"
    return outcome[0]


def rendered(source: str, messages: tuple[tuple[str, str], ...] = (("user", "hi"),)) -> Any:
    template = ChatTemplate(source, {}, {}, None, CONTEXT)
    return within_liveness(lambda: template.ids(messages, encode))


@pytest.mark.parametrize(
    ("source", "messages"),
    [
        # nested ranges, nothing written: no output to look at the clock between
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
         (("user", "hi"),)),
        # a loop in a loop over the request's messages, nothing written
        ("{% for a in messages %}{% for b in messages[1:] %}{% for c in messages %}"
         "{% endfor %}{% endfor %}{% endfor %}x", tuple(("user", "hi") for _ in range(2000))),
    ],
)  # fmt: skip
def test_a_template_that_runs_past_its_time_is_refused(
    source: str, messages: tuple[tuple[str, str], ...]
) -> None:
    began = time.monotonic()
    outcome = rendered(source, messages)
    assert isinstance(outcome, InvalidInputs), outcome
    assert f"ran past {TEMPLATE_SECONDS:g} s" in str(outcome.errors["messages"])
    assert "chat template refused the messages" in str(outcome.errors["messages"])
    assert time.monotonic() - began < LIVENESS_S


def test_a_template_that_writes_more_than_could_fit_the_context_is_refused() -> None:
    outcome = rendered("{% for i in range(100000) %}{{ messages[0]['content'] }}xxxx{% endfor %}")
    assert isinstance(outcome, InvalidInputs), outcome
    assert f"wrote more than {CONTEXT * CHARS_PER_POSITION} characters" in str(outcome.errors)


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("{{ 'x' * 10**9 }}", "a sequence of more than 100000 items"),
        ("{{ [0] * 200000 }}", "a sequence of more than 100000 items"),
        ("{{ 7 ** (10**9) }}", "an integer of more than a million bits"),
        ("{% for i in range(10**6) %}{% endfor %}", "passes 1000000, more than 100000, to a call"),
        ("{{ 'x'.ljust(10**9) }}", "passes 1000000000, more than 100000, to a call"),
        ("{{ 'x'|center(10**9) }}", "passes 1000000000, more than 100000, to a call"),
        ("{{ '%*s' % (10**9, 'x') }}", "passes 1000000000, more than 100000, to a call"),
        ("{{ '%1000000000s' % 'x' }}", "a width of more than six digits"),
        ("{{ '{:>1000000000}'.format('x') }}", "a width of more than six digits"),
        ("{{ '%1000000000s'|format('x') }}", "a width of more than six digits"),
    ],
)
def test_a_template_making_huge_values_is_refused_and_compiles_at_once(
    source: str, said: str
) -> None:
    """Jinja folds constant expressions as it compiles: `'x' * 10**9` took 23 s and
    a gigabyte at `models add`; these are not folded, and refused as they render,
    before the value is made (a width or count past 100,000 would make a string
    that long at once, with no output to look at between)."""
    assert within_liveness(lambda: check_template(source)) is None
    outcome = rendered(source)
    assert isinstance(outcome, InvalidInputs), outcome
    assert said in str(outcome.errors)


def test_a_template_within_its_bounds_renders_as_before_and_after_a_refused_one() -> None:
    source = ("{% for m in messages %}{{ m['role'] * 2 }}:{{ m['content'] }};{% endfor %}"
              "{% for i in range(3) %}{{ i ** 2 }}{% endfor %}"
              "{{ messages[-1:]|length }}{{ '%d!' % 3 }}{{ '{:>3}'.format(5) }}"
              "{{ 'x'|center(3) }}{{ '%s'|format(2) }}{{ 123 % 1000007 }}")  # fmt: skip
    expected = encode("useruser:hi;assistantassistant:yo;01413!  5 x 2123")
    messages = (("user", "hi"), ("assistant", "yo"))
    assert rendered(source, messages) == expected
    assert isinstance(rendered("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
                      InvalidInputs)  # fmt: skip
    assert rendered(source, messages) == expected  # (no deadline or count left behind)


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ 'abc'.index('z') }}", "ValueError: substring not found"),
        ("{{ 'a' + 1 }}", "TypeError"),
    ],
)
def test_a_template_that_fails_is_a_clear_error_not_the_service_s(source: str, said: str) -> None:
    """Python's own errors in a template's expressions are the template's failure on
    these messages (a 400 at the door), not a 500 or a decode loop taken down (the
    decode loop took a few types only: a ZeroDivisionError went past it)."""
    outcome = rendered(source)
    assert isinstance(outcome, InvalidInputs), outcome
    said = f"this model's chat template failed on the messages: {said}"
    assert said in str(outcome.errors["messages"])
