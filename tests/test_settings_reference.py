"""The settings reference is generated from `Settings` and cannot drift: the site's
page is built from the table `python manage.py settings` prints, and
`Settings.from_env` must read every variable the table names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.cli.settings_reference import variables
from app.platform.settings import ROOT, Settings
from tools import docs_reference

# Values a generic guess cannot make (empty defaults of list settings, checked words).
SPECIAL = {
    "CUDA_DEVICES": "0,1",
    "WORKER_QUEUES": "gpu,cpu",
    "WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/8",
    "ORT_PROVIDER": "cpu",
    "LOG_LEVEL": "debug",
    "FILE_STORE_OPTIONS": '{"endpoint_url": "http://minio:9000"}',
}


def test_the_settings_page_is_built_from_every_setting() -> None:
    page = docs_reference.on_page_markdown((ROOT / "docs/reference/settings.md").read_text())
    assert "<!-- reference:" not in page
    for variable in variables():
        assert f"| `{variable.name}` |" in page, variable.name


def another_value(name: str, default: Any) -> str:
    if name in SPECIAL:
        return SPECIAL[name]
    if isinstance(default, bool):
        return "false" if default else "true"
    if isinstance(default, (int, float)):
        return str(default + 7)
    if isinstance(default, Path):
        return "/tmp/settings-reference-test"
    if isinstance(default, tuple) and default:
        return "1,2"
    if isinstance(default, str):
        return "something-else"
    raise AssertionError(f"no test value for {name}: add one to SPECIAL")


@pytest.mark.parametrize("variable", variables(), ids=lambda v: v.name)
def test_every_documented_variable_is_read_from_the_environment(
    variable: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = getattr(Settings(), variable.field)
    monkeypatch.setenv(variable.name, another_value(variable.name, default))
    assert getattr(Settings.from_env(), variable.field) != default


def test_every_setting_is_in_the_table() -> None:
    documented = {v.field for v in variables()}
    assert documented == set(Settings.model_fields)
