"""The suite's own options (tests/helpers/harness.py), each run on a small test file in a pytest of
its own: --require-root fails a passing session that skipped a root test, --full sets the budgets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ROOT_TESTS = """
import pytest

@pytest.mark.root
@pytest.mark.skipif(True, reason="sandbox tests need root")
def test_marked_and_skipped():
    pass

def test_skipped_from_inside_for_want_of_root():
    pytest.skip("needs root and the cgroup2 hierarchy")

def test_plain():
    pass
"""

RUNNING_ROOT_TEST = """
import pytest

@pytest.mark.root
def test_marked_and_run():
    pass
"""

BUDGETS = """
from hypothesis import settings

from tests.helpers import budgets

def test_report():
    print(f"BUDGET examples={budgets.examples(300)} small={budgets.examples(20)} "
          f"seconds={budgets.seconds(60, short=10)} default={settings.default.max_examples}")
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeini("[pytest]\nmarkers =\n    root: needs root\n")
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "tests.helpers.harness", "-p", "no:cacheprovider", *args)


def test_without_the_option_skipped_root_tests_leave_the_session_passing(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_root=ROOT_TESTS)
    result = run(inner, "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK
    assert "root-only tests did not all run" not in result.stdout.str()


@pytest.mark.parametrize("option", ["--require-root", "--full"])
def test_a_skipped_root_test_fails_the_session(inner: pytest.Pytester, option: str) -> None:
    inner.makepyfile(test_root=ROOT_TESTS)
    result = run(inner, option)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*root-only tests did not all run*",
            "skipped root test: test_root.py::test_marked_and_skipped",
            "skipped root test: test_root.py::test_skipped_from_inside_for_want_of_root",
        ]
    )
    assert "test_plain" not in result.stdout.str().split("root-only tests did not all run")[1]


def test_a_session_that_runs_every_root_test_passes_only_as_root(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_root=RUNNING_ROOT_TEST)
    result = run(inner, "--require-root")
    result.assert_outcomes(passed=1)
    if os.geteuid() == 0:
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        assert "root-only tests did not all run" not in result.stdout.str()
    else:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["the session does not run as root"])


def test_a_failing_session_keeps_its_own_exit_status(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_root=ROOT_TESTS + "\ndef test_failing():\n    assert False\n")
    result = run(inner, "--require-root")
    result.assert_outcomes(passed=1, skipped=2, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*root-only tests did not all run*"])


def test_budgets_are_short_by_default_and_whole_under_full(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_budgets=BUDGETS)
    short = run(inner, "-s")
    short.assert_outcomes(passed=1)
    short.stdout.fnmatch_lines(["*BUDGET examples=50 small=20 seconds=10 default=50"])
    full = run(inner, "-s", "--full")
    full.assert_outcomes(passed=1)
    full.stdout.fnmatch_lines(["*BUDGET examples=300 small=20 seconds=60 default=100"])
