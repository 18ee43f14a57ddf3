"""Writes the fault suite's figures to docs/reliability.md when the run ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.platform.settings import ROOT
from tests.faults import report


@pytest.fixture(scope="session", autouse=True)
def reliability_report() -> Iterator[None]:
    yield
    report.write(ROOT / "docs" / "reliability.md")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Each phase's report on the test (`rep_call`), so a fixture can tell a failure."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
