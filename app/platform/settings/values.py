"""How an environment variable's text becomes a setting's value: comma lists,
switches, JSON objects, log prefixes; the source that reads each variable of a
field's name in capitals; and the line naming a value that does not fit."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import AfterValidator, BeforeValidator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import PydanticBaseSettingsSource

ROOT = Path(__file__).resolve().parents[3]  # the checkout, three above app/platform/settings/


def words(value: object) -> object:
    """A comma list: items stripped, empty ones dropped ("gpu, cpu," is two)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def numbers(value: object) -> object:
    """A comma list of numbers, every item kept: "5,,300" is an error, not two."""
    return value.split(",") if isinstance(value, str) else value


def switch(value: object) -> object:
    """On only for 1, true or yes (any case); any other word is off, never an error: a
    typo leaves private networks refused, the safe side."""
    return value.lower() in ("1", "true", "yes") if isinstance(value, str) else value


def json_object(value: object) -> str:
    """A JSON object, kept as its text (a dict would make the settings unhashable):
    given as text (an environment variable) or as a mapping."""
    parsed = json.loads(value) if isinstance(value, str) and value.strip() else value or {}
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return json.dumps(parsed, sort_keys=True)


def log_prefix(value: str) -> str:
    """Letters, digits and `._:-` only: no glob character an ACL pattern would read."""
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,50}", value):
        raise ValueError("use 1 to 50 letters, digits, '.', '_', ':' or '-'")
    return value


Words = BeforeValidator(words)
Lower = AfterValidator(str.lower)
Upper = AfterValidator(str.upper)


class SettingsError(ValueError):
    """An environment variable holds a value its setting cannot take."""


class Environment(PydanticBaseSettingsSource):
    """Each field from the variable of its name in capitals (exactly that spelling);
    unset or empty means the field's default. Values stay strings for the fields'
    validators: no JSON decoding of lists, no .env files, no secrets directory."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return os.environ.get(field_name.upper()), field_name.upper(), False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, field in self.settings_cls.model_fields.items():
            raw, _, _ = self.get_field_value(field, name)
            if raw not in (None, ""):
                values[name] = raw
        return values


def problem(error: ErrorDetails) -> str:
    """One line per wrong value: the variable, what it holds, what was expected."""
    field, *item = error["loc"]
    name = str(field).upper()
    where = f" (item {int(item[0]) + 1}: {error['input']!r})" if item else ""
    return f"  {name}={os.environ.get(name)!r}{where}: {error['msg']}"
