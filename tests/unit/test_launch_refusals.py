"""The launch socket's refusal records: bounded in size, and per caller uid in number."""

from __future__ import annotations

from enforcer.daemon.launch import bounded_argv, bounded_text
from enforcer.daemon.quota import Overflow, UidBudget


def test_a_uids_refusals_beyond_the_budget_are_counted_until_the_window_ends() -> None:
    budget = UidBudget(2, window_s=10)
    assert [budget.take(7, t) for t in (0, 1)] == [(True, 0), (True, 0)]
    assert [budget.take(7, t) for t in (2, 3, 4)] == [(False, 1), (False, 2), (False, 3)]
    assert budget.take(8, 5) == (True, 0), "another uid has its own budget"
    assert budget.due(9.9) == [], "nothing is due before the window ends"
    assert budget.due(10) == [Overflow(7, 3, 0, 10)], "the count is due when the window ends"
    assert budget.due(10.1) == [], "and only once"
    assert budget.take(7, 10) == (True, 0)
    assert budget.take(7, 11) == (True, 0)


def test_a_count_is_due_even_when_the_next_window_began_first() -> None:
    budget = UidBudget(1, window_s=10)
    assert [budget.take(7, t) for t in (0, 1, 2)] == [(True, 0), (False, 1), (False, 2)]
    assert budget.take(7, 12) == (True, 0), "a new window: the old one's count is kept for due()"
    assert budget.due(12.5) == [Overflow(7, 2, 0, 10)]
    budget.give_back([Overflow(7, 2, 0, 10)])  # its summary could not be written
    assert budget.due(13) == [Overflow(7, 2, 0, 10)]


def test_a_stop_takes_the_counts_of_windows_still_open() -> None:
    budget = UidBudget(1, window_s=60)
    assert [budget.take(7, t) for t in (0, 1)] == [(True, 0), (False, 1)]
    assert budget.take(8, 2) == (True, 0)
    assert budget.due(3) == []
    assert budget.due(float("inf")) == [Overflow(7, 1, 0, 60)], "uid 8 had nothing counted"


def test_argv_and_reason_are_cut_and_what_was_cut_is_counted() -> None:
    assert bounded_argv(["ab", "cd"], 4) == (["ab", "cd"], {})
    assert bounded_argv(["ab", "cdef", "g"], 4) == (["ab", "cd"], {"arguments": 3, "characters": 7})
    assert bounded_argv(["abcd", "e"], 4) == (["abcd"], {"arguments": 2, "characters": 5})
    assert bounded_text("abc", 3) == "abc"
    assert bounded_text("abcdef", 3) == "abc... (3 more characters)"
