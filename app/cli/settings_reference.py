"""The settings table, made from `app.platform.settings.Settings` itself: each field is
the environment variable of its name in capitals, with the field's default and
description. `python manage.py settings` prints it, the documentation site's settings
reference is built from it (tools/docs_reference.py), and a test checks that
`Settings.from_env` reads every variable it names, so the documentation cannot drift
from the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.platform.settings import ROOT, Settings


@dataclass(frozen=True)
class Variable:
    name: str  # the environment variable
    field: str
    default: str
    description: str


def variables() -> list[Variable]:
    """Every setting, in the order of the class."""
    defaults = Settings()  # as validated, e.g. WEBHOOK_RETRY_SCHEDULE's numbers as floats
    found: list[Variable] = []
    for name, spec in Settings.model_fields.items():
        if not spec.description:
            raise ValueError(f"Settings.{name} has no description")
        default = _default(getattr(defaults, name))
        found.append(Variable(name.upper(), name, default, " ".join(spec.description.split())))
    return found


def _default(value: object) -> str:
    if isinstance(value, Path):
        try:
            return f"`{value.relative_to(ROOT)}/` (in the checkout)"
        except ValueError:
            return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, frozenset)):
        return f"`{','.join(f'{v:g}' if isinstance(v, float) else str(v) for v in value)}`" \
            if value else "(empty)"  # fmt: skip
    if value == "":
        return "(empty)"
    if isinstance(value, float):
        return f"`{int(value)}`" if value.is_integer() else f"`{value:g}`"
    return f"`{value}`"


def markdown() -> str:
    """The table, in Markdown."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.default} | {_cell(v.description)} |" for v in variables()]
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
