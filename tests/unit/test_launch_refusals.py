"""The launch socket's refusal records: bounded in size, and per caller uid in number."""

from __future__ import annotations

from enforcer.daemon.launch import RefusalBudget, bounded_argv, bounded_text


def test_a_uids_refusals_beyond_the_budget_are_counted_until_the_window_ends() -> None:
    budget = RefusalBudget(detailed=2, window_s=10)
    assert [budget.take(7, t) for t in (0, 1)] == [(True, 0), (True, 0)]
    assert [budget.take(7, t) for t in (2, 3, 4)] == [(False, 1), (False, 2), (False, 3)]
    assert budget.take(8, 5) == (True, 0), "another uid has its own budget"
    assert budget.take(7, 10) == (True, 3), "the next window's first refusal carries the count"
    assert budget.take(7, 11) == (True, 0)


def test_argv_and_reason_are_cut_and_what_was_cut_is_counted() -> None:
    assert bounded_argv(["ab", "cd"], 4) == (["ab", "cd"], {})
    assert bounded_argv(["ab", "cdef", "g"], 4) == (["ab", "cd"], {"arguments": 3, "characters": 7})
    assert bounded_argv(["abcd", "e"], 4) == (["abcd"], {"arguments": 2, "characters": 5})
    assert bounded_text("abc", 3) == "abc"
    assert bounded_text("abcdef", 3) == "abc... (3 more characters)"
