from __future__ import annotations

import pytest

from enforcer.daemon import affinity


def test_one_all_and_lists() -> None:
    assert affinity.chosen_cpus("one", {0, 1, 3}) == {3}
    assert affinity.chosen_cpus("all", {0, 1}) is None
    assert affinity.chosen_cpus("0,1", {0, 1, 2}) == {0, 1}


def test_bad_settings_are_refused_not_ignored() -> None:
    for bad in ("", "two", "0-3", "1,", "-1"):
        with pytest.raises(ValueError):
            affinity.validate(bad)
    with pytest.raises(ValueError, match="may not use"):
        affinity.chosen_cpus("5", {0, 1})
