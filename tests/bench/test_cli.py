"""`manage.py bench` without what bench/requirements.txt installs says what to run."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from bench.cli import bench


def test_a_missing_bench_dependency_names_make_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    result = CliRunner().invoke(bench, ["--quick"])
    assert result.exit_code != 0
    assert "make bench" in result.output and "bench/requirements.txt" in result.output
