"""Sessions the daemon launched: who runs them, their secret, and max_concurrent per agent."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class SessionLimit(Exception):
    pass


@dataclass
class SessionRecord:
    session: str
    agent: str
    uid: int
    gid: int
    argv: tuple[str, ...]
    started_ms: int
    token: str = field(repr=False)
    pid: int = 0  # the session supervisor's pid, once the spawner reports it
    terminating: bool = False  # TerminateSession was asked: the launch, if not sent yet, is not


class SessionRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._sessions: dict[str, SessionRecord] = {}
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
    ) -> SessionRecord:
        """Count and register in one step, so two launches cannot both take the last slot. A full
        agent waits up to `wait_s` for a slot: a session's supervisor tells its client that it ended
        a moment before the daemon hears of it, and the client may launch again at once."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                running = sum(1 for s in self._sessions.values() if s.agent == agent)
                left = deadline - time.monotonic()
                if max_concurrent is None or running < max_concurrent or left <= 0:
                    break
                self._ended.wait(left)
            if max_concurrent is not None and running >= max_concurrent:
                raise SessionLimit(
                    f"agent {agent!r} already runs {running} session(s); max_concurrent is {max_concurrent}"
                )
            record = SessionRecord(
                session="session-" + secrets.token_hex(8),
                agent=agent,
                uid=uid,
                gid=gid,
                argv=argv,
                started_ms=now_ms,
                token=secrets.token_urlsafe(24),
            )
            self._sessions[record.session] = record
            return record

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
