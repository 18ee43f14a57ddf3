"""Writes the fault suite's figures to docs/reliability.md when the run ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.platform.settings import ROOT
from tests.faults import report


@pytest.fixture(scope="session", autouse=True)
def reliability_report() -> Iterator[None]:
    yield
    report.write(ROOT / "docs" / "reliability.md")
