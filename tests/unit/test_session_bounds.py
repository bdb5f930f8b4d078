"""The daemon's bounds on sessions (registry.py): per caller uid, in all, and the tasks one uid's
sessions may hold together; and the unit of a caller's refusal budget each launch takes ahead."""

from __future__ import annotations

import threading
import time

import pytest

from enforcer.daemon.quota import UidBudget
from enforcer.daemon.registry import SessionBounds, SessionLimit, SessionRecord, SessionRegistry

A, B = 1001, 1002


def _register(
    registry: SessionRegistry, uid: int, bounds: SessionBounds, pids_max: int = 512, wait_s: float = 0.0
) -> SessionRecord:
    return registry.register("agent", None, uid, uid, ("cat",), 0, wait_s=wait_s, bounds=bounds, pids_max=pids_max)


def test_a_uid_at_its_bound_is_refused_and_another_uid_still_launches() -> None:
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=2)
    first, _second = _register(registry, A, bounds), _register(registry, A, bounds)
    with pytest.raises(SessionLimit, match=r"uid 1001 already runs 2 session\(s\); the operator's max_sessions_per"):
        _register(registry, A, bounds)
    assert _register(registry, B, bounds).uid == B, "another uid has its own bound"
    registry.end(first.session)
    assert _register(registry, A, bounds).uid == A, "an ended session frees its uid's place"
    with pytest.raises(SessionLimit):
        _register(registry, A, bounds)


def test_every_callers_sessions_together_are_bounded() -> None:
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=5, total=3)
    made = [_register(registry, uid, bounds) for uid in (A, A, B)]
    with pytest.raises(SessionLimit, match="3 sessions already run; the operator's max_sessions is 3"):
        _register(registry, 1003, bounds)
    registry.end(made[2].session)
    assert _register(registry, 1003, bounds).uid == 1003


def test_a_uids_sessions_hold_at_most_its_share_of_tasks() -> None:
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=10, tasks_per_uid=1000)
    big = _register(registry, A, bounds, pids_max=600)
    _register(registry, A, bounds, pids_max=400)  # exactly the share
    with pytest.raises(SessionLimit, match=r"uid 1001's sessions already hold 1000 tasks .* share of 1000"):
        _register(registry, A, bounds, pids_max=1)
    assert _register(registry, B, bounds, pids_max=1000).uid == B
    registry.end(big.session)
    _register(registry, A, bounds, pids_max=600)
    with pytest.raises(SessionLimit):  # one session larger than the share never runs
        _register(registry, 1003, bounds, pids_max=1001)


def test_a_launch_at_its_bound_waits_for_a_session_that_is_ending() -> None:
    """A supervisor tells its client the session ended a moment before the daemon hears of it: a
    client launching again at once waits for the end rather than being refused."""
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=1)
    first = _register(registry, A, bounds)
    threading.Timer(0.2, registry.end, (first.session,)).start()
    started = time.monotonic()
    assert _register(registry, A, bounds, wait_s=5.0).uid == A
    assert 0.15 < time.monotonic() - started < 4.0
    started = time.monotonic()
    with pytest.raises(SessionLimit):  # nothing ends: refused once the wait is over
        _register(registry, A, bounds, wait_s=0.3)
    assert time.monotonic() - started >= 0.3


def test_racing_launches_of_one_uid_never_pass_its_bound() -> None:
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=3)
    taken: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()

    def launch() -> None:
        try:
            record = _register(registry, A, bounds)
            with lock:
                taken.append(record.session)
        except SessionLimit as exc:
            with lock:
                refused.append(str(exc))

    threads = [threading.Thread(target=launch) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 3 and len(refused) == 29
    assert len([s for s in registry.all() if s.uid == A]) == 3


def test_a_unit_reserved_ahead_is_given_back_or_kept() -> None:
    budget = UidBudget(2, window_s=10)
    assert budget.reserve(A, 0.0) == (True, 0)
    assert budget.reserve(A, 0.5) == (True, 0)
    assert budget.reserve(A, 0.6) == (False, None), "both units taken ahead: a third launch counts only"
    assert budget.take(A, 0.7) == (False, 1), "the daemon's own refusals see the units taken ahead"
    budget.release(A, 0, 1.0)  # that session ended unrefused
    assert budget.used(A, 1.0) == 1
    assert budget.take(A, 1.1) == (True, 0)
    assert budget.count(A, 1.2) == 2, "a refusal withheld elsewhere is counted with the others"
    budget.release(A, 0, 20.0)  # its slot slid out long ago: nothing weighs any more, nothing to give
    assert budget.used(A, 20.0) == 0
    assert budget.reserve(A, 20.0)[0]


def test_ends_racing_registrations_never_let_a_uid_pass_its_bound() -> None:
    """Launches that wait for an ending session, and ends, from many threads at once: at no moment
    does the uid run more than its bound, and every session that ended freed its place."""
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=2, total=3)
    lock = threading.Lock()
    peak, running, refused = [0], [0], [0]

    def churn() -> None:
        for _ in range(200):
            try:
                record = _register(registry, A, bounds, wait_s=0.005)
            except SessionLimit:
                with lock:
                    refused[0] += 1
                continue
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0], len(registry.all()))
                running[0] -= 1
            registry.end(record.session)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] <= 2, peak
    assert registry.all() == []
    assert _register(registry, A, bounds) and _register(registry, B, bounds)


def test_a_uid_has_at_most_its_bound_of_launches_waiting() -> None:
    """Each waiting launch holds a daemon thread and its caller's descriptors: beyond as many as the
    uid may run, another has no session of its own left to wait for and is refused at once."""
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=1)
    first = _register(registry, A, bounds)
    outcome: list[str] = []

    def wait() -> None:
        try:
            _register(registry, A, bounds, wait_s=1.0)
            outcome.append("registered")
        except SessionLimit as exc:
            outcome.append(str(exc))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert _until_waiting(registry, A)
    started = time.monotonic()
    with pytest.raises(SessionLimit, match="1 launches of uid 1001 are already waiting for a place"):
        _register(registry, A, bounds, wait_s=5.0)
    assert time.monotonic() - started < 0.5, "refused at once"
    assert _register(registry, B, bounds, wait_s=1.0).uid == B, "another uid is not held up"
    waiter.join()
    assert outcome == ["uid 1001 already runs 1 session(s); the operator's max_sessions_per_uid is 1"], outcome
    registry.end(first.session)
    assert _register(registry, A, bounds, wait_s=1.0).uid == A, "the waiter gave its place back"


def _until_waiting(registry: SessionRegistry, uid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if registry._waiting.get(uid):
            return True
        time.sleep(0.01)
    return False


def test_every_callers_launches_waiting_together_are_bounded() -> None:
    """Callers with many uids cannot hold more waiting launches than sessions may run in all."""
    registry, bounds = SessionRegistry(), SessionBounds(per_uid=1, total=2)
    _register(registry, A, bounds)
    _register(registry, B, bounds)
    waiters = [threading.Thread(target=_refused_after_waiting, args=(registry, uid, bounds)) for uid in (A, B)]
    for waiter in waiters:
        waiter.start()
    assert _until_waiting(registry, A) and _until_waiting(registry, B)
    started = time.monotonic()
    with pytest.raises(SessionLimit, match=r"2 sessions already run; .*; 2 launches are already waiting for a place"):
        _register(registry, 1003, bounds, wait_s=5.0)
    assert time.monotonic() - started < 0.5, "refused at once"
    for waiter in waiters:
        waiter.join()
    assert not registry._waiting, "every waiter gave its place back"


def _refused_after_waiting(registry: SessionRegistry, uid: int, bounds: SessionBounds) -> None:
    with pytest.raises(SessionLimit):
        _register(registry, uid, bounds, wait_s=1.0)
