"""The HTTP door's JSON, by orjson: request bodies, every JSON answer (Flask's and
flask-smorest's) and KServe v2 tensors. The standard library's encoder was a
visible share of a sync call's CPU; orjson also refuses NaN and Infinity
literals, which are not JSON, and writes NaN as null."""

from __future__ import annotations

from typing import Any

import orjson
from flask.json.provider import DefaultJSONProvider

# As Flask's own encoder: keys sorted (stable answers for caches and diffs), and a
# bare datetime as an HTTP date (orjson would write RFC 3339 itself).
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def dumps_bytes(value: Any, *, sort_keys: bool = True) -> bytes:
    """`value` as JSON; `sort_keys=False` keeps the order it was built in (KServe's
    answers read model_name, model_version, outputs)."""
    option = _OPTIONS if sort_keys else _OPTIONS & ~orjson.OPT_SORT_KEYS
    return orjson.dumps(value, default=_default, option=option)


def loads(data: str | bytes) -> Any:
    """Raises ValueError (orjson.JSONDecodeError) for anything that is not JSON,
    nesting beyond 1024 levels and integers beyond 64 bits included."""
    return orjson.loads(data)


def _default(value: Any) -> Any:
    """What orjson leaves to us (datetimes, Decimal, objects with __html__), as
    Flask's own encoder writes it."""
    return DefaultJSONProvider.default(value)


_COMPACT = {"separators": (",", ":")}


class OrjsonProvider(DefaultJSONProvider):
    """Flask's JSON provider over orjson; a call with options orjson does not take
    (indent, a `default`...) goes to the standard library as before."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        # jsonify (and flask-smorest's every answer) asks for compact separators,
        # which is how orjson writes anyway: only other options go to the standard
        # library, or every answer would.
        if kwargs and kwargs != _COMPACT:
            return super().dumps(obj, **kwargs)
        return dumps_bytes(obj).decode()

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        if kwargs:
            return super().loads(s, **kwargs)
        return loads(s)
