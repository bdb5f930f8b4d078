"""How long the long tests run: short by default while developing, in full under `pytest --full`
(scripts/test.sh, hence CI). Property tests take their example count from examples(), the load
test its duration from seconds(); tests/helpers/harness.py chooses the profile before collection."""

from __future__ import annotations

from hypothesis import settings

# A property test's budget without --full: enough to exercise every strategy, short enough to rerun.
SHORT_EXAMPLES = 50

settings.register_profile("short", max_examples=SHORT_EXAMPLES)
settings.register_profile("full")  # hypothesis' own defaults; each test names its full budget

_full = False


def configure(full: bool) -> None:
    global _full
    _full = full
    settings.load_profile("full" if full else "short")


def full() -> bool:
    return _full


def examples(budget: int) -> int:
    """A property test's example count: its whole budget under --full, at most the short profile's otherwise."""
    return budget if _full else min(budget, settings.get_profile("short").max_examples)


def seconds(budget: float, short: float) -> float:
    """A timed test's duration: its whole budget under --full, `short` otherwise."""
    return budget if _full else short
