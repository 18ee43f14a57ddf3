"""The command line itself (no server): its version, its description, and the
commands that run only from a checkout. `submit` against the real service:
tests/client/test_manage_submit.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import app
from app.cli import main
from app.cli.main import cli


def test_version_is_the_packages() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"inference-jobs, version {app.__version__}\n"
    assert main.version() == app.__version__  # not installed here: the fallback


def test_help_says_what_the_service_is_and_its_commands() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    assert "Inference job service" in result.stdout
    for command in ("up", "models build", "submit", "create-api-key", "db upgrade"):
        assert command in result.stdout, command


def test_checkout_commands_say_so_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "ROOT", Path(sys.prefix) / "lib")  # as site-packages is
    result = CliRunner().invoke(cli, ["db", "upgrade"])
    assert result.exit_code == 1
    assert "`db` runs from a checkout" in result.output
