"""The suite's own options, a pytest plugin (loaded by tests/conftest.py).

--full          the long budgets (tests/helpers/budgets.py) and --require-root: what CI runs.
--require-root  fail the session when it does not run as root or when a test marked `root` was
                skipped: a skipped kernel test is a layer nobody checked, not a pass.
"""

from __future__ import annotations

import os

import pytest

from . import budgets

SHOWN = 20  # lines of the failure summary; a session run as a user skips hundreds


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("adl-enforcer")
    group.addoption(
        "--full",
        action="store_true",
        help="run the long budgets (the 60 s daemon load test, every property test's whole example count) "
        "and imply --require-root; scripts/test.sh and CI pass it",
    )
    group.addoption(
        "--require-root",
        action="store_true",
        help="fail the session when not run as root or when a test marked root was skipped",
    )


def pytest_configure(config: pytest.Config) -> None:
    full = bool(config.getoption("full"))
    budgets.configure(full)
    if full or config.getoption("require_root"):
        config.pluginmanager.register(RootRequired(os.geteuid() == 0), "adl-enforcer-root-required")


class RootRequired:
    """Collects the root tests that did not run; turns a passing session into a failing one."""

    def __init__(self, is_root: bool) -> None:
        self.is_root = is_root
        self.skipped: list[str] = []

    def problems(self) -> list[str]:
        found = [] if self.is_root else ["the session does not run as root"]
        return found + [f"skipped root test: {nodeid}" for nodeid in self.skipped]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        # A skip from inside a fixture or a test body ("needs root") carries no marker, only its reason.
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        if "root" in report.keywords or "root" in reason:
            self.skipped.append(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.problems() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        problems = self.problems()
        if problems:
            terminalreporter.write_sep("=", "root-only tests did not all run (--require-root)", red=True)
            for line in problems[:SHOWN]:
                terminalreporter.write_line(line)
            if len(problems) > SHOWN:
                terminalreporter.write_line(f"... and {len(problems) - SHOWN} more")
