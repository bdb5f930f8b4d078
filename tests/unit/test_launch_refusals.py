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
    # The two granted at 0 and 1 lie within the last 10 s at 10: refused until each slides out.
    assert budget.take(7, 10) == (False, 1)
    assert budget.take(7, 11) == (True, 0)


def test_a_count_is_due_even_when_the_next_window_began_first() -> None:
    budget = UidBudget(1, window_s=10)
    assert [budget.take(7, t) for t in (0, 1, 2)] == [(True, 0), (False, 1), (False, 2)]
    # At 20 nothing of the first window weighs on the second any more (see the sliding tests below).
    assert budget.take(7, 20) == (True, 0), "a new window: the old one's count is kept for due()"
    assert budget.due(20.5) == [Overflow(7, 2, 0, 10)]
    budget.give_back([Overflow(7, 2, 0, 10)])  # its summary could not be written
    assert budget.due(21) == [Overflow(7, 2, 0, 10)]


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


def test_a_burst_at_the_edge_of_two_windows_is_refused() -> None:
    """Fixed windows let a uid spend its budget just before one window ended and again just after:
    twice its budget within a moment. The budget bounds any window_s seconds, sliding by tenths."""
    budget = UidBudget(1000, window_s=10)
    assert budget.take(7, 0.0, 1) == (True, 0)  # the window begins
    assert budget.take(7, 9.9, 999) == (True, 0)  # the whole budget, at the end of the window
    assert budget.take(7, 10.1, 500) == (False, 1), "half the budget again 0.2 s later"
    assert budget.take(7, 10.9, 1) == (False, 2), "even one unit, while the whole budget lies within 10 s"
    assert budget.take(7, 11.0, 2) == (False, 3)
    assert budget.take(7, 11.0, 1) == (True, 0), "the grant at 0.0 has slid out of the last 10 s"
    assert budget.take(7, 19.9, 1) == (False, 4)
    assert budget.take(7, 20.0, 999) == (True, 0), "the burst at 9.9 has slid out"
    assert budget.used(7, 20.0) == 1000
    assert budget.due(20.1) == [Overflow(7, 4, 10.1, 10)], "the second window's refusals, counted"
    assert budget.take(8, 10.2, 1000) == (True, 0), "another uid has its own budget"


def test_no_stretch_of_a_window_grants_more_than_the_budget() -> None:
    """A uid asking as fast as it may for 40 windows' tenths: within any window_s seconds it is
    granted at most its budget, and over the run it still gets about the budget per window."""
    capacity, window_ms = 1000, 10_000
    budget = UidBudget(capacity, window_s=window_ms / 1000)
    granted: list[tuple[int, int]] = []  # (ms, units)
    for ms in range(0, 40_000, 50):
        for cost in (50, 5):  # large requests first, then small ones to use what is left
            while budget.take(7, ms / 1000, cost)[0]:
                granted.append((ms, cost))
    for end, _ in granted:
        spent = sum(units for ms, units in granted if end - window_ms <= ms <= end)
        assert spent <= capacity, (end, spent)
    total = sum(units for _, units in granted)
    assert 3 * capacity <= total <= 4 * capacity, total
    last_slot_end = (granted[-1][0] // 1000 + 1) * 1000  # a slot is a tenth of the window
    assert budget.used(7, (last_slot_end + window_ms - 1) / 1000) > 0, "the last grants count for a window"
    assert budget.used(7, (last_slot_end + window_ms) / 1000) == 0
    assert sum(o.counted for o in budget.due(60.0)) > 0
    assert budget._windows == {}, "forgotten once nothing of it is within a window"
