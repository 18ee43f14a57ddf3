"""Each suite's time budget (`[tool.test-budgets]` in pyproject.toml, minutes on CI's
machine class): `pytest --budget NAME` fails a run that goes past one and a half
times NAME's budget, between tests, naming the budget, long before CI's own limit
would end it with nothing said. The Makefile's targets name their suite."""

from __future__ import annotations

import time
import tomllib

import pytest

from app.platform.settings import ROOT

OVER = 1.5  # a run may take this many times its budget before it fails


def budgets() -> dict[str, float]:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["test-budgets"]
    return {name: float(minutes) for name, minutes in table.items()}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--budget",
        default="",
        help="the suite's name in [tool.test-budgets]: fail past 1.5 times its minutes",
    )


class Budget:
    def __init__(self, name: str, minutes: float) -> None:
        self.name, self.minutes = name, minutes
        self.started = time.monotonic()

    @property
    def limit_s(self) -> float:
        return self.minutes * 60 * OVER

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def words(self) -> str:
        return (
            f"the {self.name} suite's budget is {self.minutes:g} min "
            f"([tool.test-budgets] in pyproject.toml); it has run "
            f"{self.elapsed_s() / 60:.1f} min, past {OVER:g} times that ({self.limit_s / 60:.1f})"
        )

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """After each test (under pytest-xdist, as the controller hears of it): a run
        past its limit schedules nothing more."""
        if report.when == "teardown" and self.elapsed_s() > self.limit_s:
            why = f"over budget: {self.words()}; make the suite faster"
            self.session.shouldstop = why
            controller = self.session.config.pluginmanager.getplugin("dsession")
            if controller is not None:  # pytest-xdist's loop keeps its own flag
                controller.shouldstop = why

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.elapsed_s() > self.limit_s and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        took = self.elapsed_s() / 60
        line = f"{self.name} suite: {took:.1f} min of its {self.minutes:g} min budget"
        if self.elapsed_s() > self.limit_s:
            terminalreporter.write_line(f"FAILED, over budget: {self.words()}", red=True)
        else:
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("--budget")
    if not name or hasattr(config, "workerinput"):  # (an xdist worker: its controller counts)
        return
    known = budgets()
    if name not in known:
        raise pytest.UsageError(f"--budget {name}: no such suite in {sorted(known)}")
    config.pluginmanager.register(Budget(name, known[name]), "suite-budget")
