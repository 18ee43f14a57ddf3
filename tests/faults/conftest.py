"""Writes the fault suite's figures to docs/reliability.md when the run ends."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.platform.settings import ROOT
from tests.faults import report
from tests.faults.harness import FaultStack

# Under pytest-xdist each test process leaves its tallies here for the controller.
TALLIES = ROOT / "var" / "test" / "fault-tallies"


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        shutil.rmtree(TALLIES, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The report, written once, by the run's own process, with every process's rows."""
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:
        report.hand_over(TALLIES / f"{worker['workerid']}.json")
        return
    report.take_over(TALLIES)
    report.write(ROOT / "docs" / "reliability.md")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Each phase's report on the test (`rep_call`), so a fixture can tell a failure."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def make_stack(
    model_repository: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., FaultStack]]:
    """`make_stack(guards_off, **env)`: a whole stack under var/test, closed after the
    test; a failed test's process logs are kept under var/test/fault-logs."""
    stacks: list[FaultStack] = []

    def make(guards_off: str = "", models: Path | None = None, **env: str) -> FaultStack:
        """`models`: a repository of the scenario's own (one it changes)."""
        root = ROOT / "var" / "test" / f"fault-{uuid.uuid4().hex[:8]}"
        stack = FaultStack(root, models or model_repository, guards_off, **env)
        stacks.append(stack)
        return stack

    yield make
    outcome = getattr(request.node, "rep_call", None)
    for stack in stacks:
        if outcome is not None and outcome.failed:
            stack.keep_logs(ROOT / "var" / "test" / "fault-logs" / request.node.name)
        stack.close()
