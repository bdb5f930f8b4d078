"""Sessions the daemon launched: who runs them, their secret, and the bounds on how many run: per
agent (its policy's max_concurrent), per caller uid and in all (the operator's), and the tasks a uid's
sessions may hold together (their pids_max, against its share of all sessions' tasks)."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class SessionLimit(Exception):
    pass


@dataclass(frozen=True)
class SessionBounds:
    """The operator's bounds on sessions (Settings: max_sessions_per_uid, max_sessions, and the
    tasks a uid's sessions may ask for together); None: unbounded."""

    per_uid: int | None = None
    total: int | None = None
    tasks_per_uid: int | None = None  # the sum of the pids_max of one uid's sessions


@dataclass
class SessionRecord:
    session: str
    agent: str
    uid: int
    gid: int
    argv: tuple[str, ...]
    started_ms: int
    token: str = field(repr=False)
    pids_max: int = 0  # the session's own tasks limit: what it holds of its uid's share
    pid: int = 0  # the session supervisor's pid, once the spawner reports it
    terminating: bool = False  # TerminateSession was asked: the launch, if not sent yet, is not
    # Whether a refusal its supervisor finds may be recorded in detail, and the unit of its uid's
    # refusal budget taken for it (launch.py): given back when the session ends unrefused.
    refusal_detailed: bool = True
    refusal_slot: int | None = None


class SessionRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._sessions: dict[str, SessionRecord] = {}
        self._waiting: dict[int, int] = {}  # per caller uid: its launches waiting for a place
        self._on_end: list[Callable[[SessionRecord], None]] = []

    def on_end(self, callback: Callable[[SessionRecord], None]) -> None:
        """Call `callback(record)` after each session ends (outside the lock)."""
        self._on_end.append(callback)

    def register(
        self,
        agent: str,
        max_concurrent: int | None,
        uid: int,
        gid: int,
        argv: tuple[str, ...],
        now_ms: int,
        wait_s: float = 0.0,
        bounds: SessionBounds | None = None,
        pids_max: int = 0,
    ) -> SessionRecord:
        """Count and register in one step, so two launches cannot both take the last slot. A full
        bound waits up to `wait_s` for a slot: a session's supervisor tells its client that it ended
        a moment before the daemon hears of it, and the client may launch again at once. Each
        waiting launch holds a thread and its caller's descriptors in the daemon: a uid may have as
        many waiting as its bound lets it run (no more of its sessions can end), all callers together
        as many as may run in all; the rest are refused at once."""
        bounds = bounds or SessionBounds()
        deadline = time.monotonic() + wait_s
        with self._lock:
            full = self._full(agent, max_concurrent, uid, bounds, pids_max)
            if full is not None and wait_s > 0:
                waiting = self._waiting.get(uid, 0)
                if bounds.per_uid is not None and waiting >= bounds.per_uid:
                    raise SessionLimit(f"{full}; {waiting} launches of uid {uid} are already waiting for a place")
                everyone = sum(self._waiting.values())
                if bounds.total is not None and everyone >= bounds.total:
                    raise SessionLimit(f"{full}; {everyone} launches are already waiting for a place")
            self._waiting[uid] = self._waiting.get(uid, 0) + 1
            try:
                while full is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SessionLimit(full)
                    self._ended.wait(left)
                    full = self._full(agent, max_concurrent, uid, bounds, pids_max)
            finally:
                self._waiting[uid] -= 1
                if not self._waiting[uid]:
                    del self._waiting[uid]
            record = SessionRecord(
                session="session-" + secrets.token_hex(8),
                agent=agent,
                uid=uid,
                gid=gid,
                argv=argv,
                started_ms=now_ms,
                token=secrets.token_urlsafe(24),
                pids_max=pids_max,
            )
            self._sessions[record.session] = record
            return record

    def _full(
        self, agent: str, max_concurrent: int | None, uid: int, bounds: SessionBounds, pids_max: int
    ) -> str | None:
        """Which bound one more session would pass, as its refusal says it; None: none. Under the lock."""
        sessions = self._sessions.values()
        if max_concurrent is not None:
            running = sum(1 for s in sessions if s.agent == agent)
            if running >= max_concurrent:
                return f"agent {agent!r} already runs {running} session(s); max_concurrent is {max_concurrent}"
        if bounds.per_uid is not None:
            running = sum(1 for s in sessions if s.uid == uid)
            if running >= bounds.per_uid:
                return (
                    f"uid {uid} already runs {running} session(s); the operator's max_sessions_per_uid is "
                    f"{bounds.per_uid}"
                )
        if bounds.total is not None and len(self._sessions) >= bounds.total:
            return f"{len(self._sessions)} sessions already run; the operator's max_sessions is {bounds.total}"
        if bounds.tasks_per_uid is not None:
            held = sum(s.pids_max for s in sessions if s.uid == uid)
            if held + pids_max > bounds.tasks_per_uid:
                return (
                    f"uid {uid}'s sessions already hold {held} tasks (their pids_max); {pids_max} more would "
                    f"pass its share of {bounds.tasks_per_uid} (the operator's session_tasks_share_per_uid)"
                )
        return None

    def set_pid(self, session: str, pid: int) -> None:
        with self._lock:
            if session in self._sessions:
                self._sessions[session].pid = pid

    def end(self, session: str) -> SessionRecord | None:
        with self._lock:
            record = self._sessions.pop(session, None)
            self._ended.notify_all()
        if record is not None:
            for callback in self._on_end:
                callback(record)
        return record

    def get(self, session: str) -> SessionRecord | None:
        return self._sessions.get(session)

    def authenticate(self, session: str, token: str) -> SessionRecord | None:
        record = self._sessions.get(session)
        if record is None or not hmac.compare_digest(record.token.encode(), token.encode()):
            return None
        return record

    def all(self) -> list[SessionRecord]:
        with self._lock:
            return list(self._sessions.values())
