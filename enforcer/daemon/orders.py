"""The messages between adl-enforcerd and its spawner, and the spawner's configuration: typed, and
checked field by field on receipt. An order with a field missing, a field unknown or a value of the
wrong type is refused whole: the spawner never guesses what the daemon meant.

No gRPC here: the spawner imports this before any gRPC code exists in the process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .. import data
from ..egress_values import EgressValues


class OrderError(ValueError):
    """An order the spawner refuses (the message says which field and why)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value


def _is_texts(value: Any) -> bool:
    return isinstance(value, tuple) and all(_is_text(item) for item in value)


def _is_object(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(key, str) for key in value)


def _is_environ(value: Any) -> bool:
    return isinstance(value, Mapping) and all(_is_text(k) and _is_text(v) for k, v in value.items())


@dataclass(frozen=True)
class LaunchOrder:
    """One session to launch, as the daemon decided it (enforcer/daemon/launch.py)."""

    session: str
    agent: str
    adl: Mapping[str, Any]  # the documents the daemon compiled, compiled again by the supervisor
    aaif: Mapping[str, Any] | None
    policy_digest: str  # what they compiled to when the daemon decided
    argv: tuple[str, ...]
    environ: Mapping[str, str]
    cwd: str
    uid: int  # the caller's, from the kernel (SO_PEERCRED): the agent runs as it
    gid: int
    accept_unenforced: tuple[str, ...]
    pids_max: int
    # Whether a refusal the supervisor finds before the session's launch record may be recorded in
    # detail: False once the caller's launch refusals are beyond its budget (quota.py); the supervisor
    # then only reports it (REFUSAL_COUNTED) and the daemon counts it in the uid's summary.
    refusal_detailed: bool = True

    def __post_init__(self) -> None:
        checks = {
            "session": _is_text(self.session) and bool(self.session),
            "agent": _is_text(self.agent),
            "adl": _is_object(self.adl),
            "aaif": self.aaif is None or _is_object(self.aaif),
            "policy_digest": _is_text(self.policy_digest) and bool(self.policy_digest),
            "argv": _is_texts(self.argv) and bool(self.argv),
            "environ": _is_environ(self.environ),
            "cwd": _is_text(self.cwd) and os.path.isabs(self.cwd),
            "uid": _is_int(self.uid) and self.uid >= 0,
            "gid": _is_int(self.gid) and self.gid >= 0,
            "accept_unenforced": _is_texts(self.accept_unenforced),
            "pids_max": _is_int(self.pids_max) and self.pids_max > 0,
            "refusal_detailed": isinstance(self.refusal_detailed, bool),
        }
        wrong = [name for name, ok in checks.items() if not ok]
        if wrong:
            raise OrderError(f"launch order: invalid {', '.join(wrong)}")

    def to_json(self) -> bytes:
        return _encode("launch", {f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_members(cls, members: Mapping[str, Any]) -> LaunchOrder:
        _exact_members("launch order", members, cls)
        values = dict(members)
        for name in ("argv", "accept_unenforced"):
            if isinstance(values[name], list):
                values[name] = tuple(values[name])
        return cls(**values)


@dataclass(frozen=True)
class TerminateOrder:
    """End a session at whatever step it is (TerminateSession)."""

    session: str

    def __post_init__(self) -> None:
        if not (_is_text(self.session) and self.session):
            raise OrderError("terminate order: invalid session")

    def to_json(self) -> bytes:
        return _encode("terminate", {"session": self.session})

    @classmethod
    def from_members(cls, members: Mapping[str, Any]) -> TerminateOrder:
        _exact_members("terminate order", members, cls)
        return cls(**members)


Order = LaunchOrder | TerminateOrder
_KINDS: dict[str, type[LaunchOrder] | type[TerminateOrder]] = {"launch": LaunchOrder, "terminate": TerminateOrder}


def _encode(kind: str, members: dict[str, Any]) -> bytes:
    return json.dumps({kind: members}).encode()


def _decode(data: bytes, what: str, kinds: Mapping[str, type]) -> tuple[str, dict[str, Any]]:
    """(kind, members) of a message {kind: {members}} whose kind is one of `kinds`."""
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise OrderError(f"{what} that is not JSON: {exc}") from None
    if not isinstance(message, dict) or len(message) != 1:
        raise OrderError(f"{what} is an object with one member, its kind")
    ((kind, members),) = message.items()
    if kind not in kinds or not isinstance(members, dict):
        raise OrderError(f"{what}: unknown kind {kind!r}")
    return kind, members


def read_order(data: bytes) -> Order:
    """The order in a frame from the daemon: {"launch": {...}} or {"terminate": {...}}."""
    kind, members = _decode(data, "an order", _KINDS)
    return _KINDS[kind].from_members(members)


def session_named(data: bytes) -> str | None:
    """The session a refused order was for, when it can be told: the spawner reports it ended."""
    with_session: Any = None
    try:
        message = json.loads(data)
        with_session = next(iter(message.values())) if isinstance(message, dict) and len(message) == 1 else None
    except ValueError:
        return None
    session = with_session.get("session") if isinstance(with_session, dict) else None
    return session if isinstance(session, str) and session else None


@dataclass(frozen=True)
class SessionStarted:
    """The spawner to the daemon: a session's supervisor runs, as `pid`."""

    session: str
    pid: int

    def __post_init__(self) -> None:
        if not (_is_text(self.session) and self.session and _is_int(self.pid) and self.pid > 0):
            raise OrderError("started event: invalid session or pid")

    def to_json(self) -> bytes:
        return _encode("started", {"session": self.session, "pid": self.pid})


# A supervisor's exit status that tells the daemon its session was refused before it ran (no other
# path of a supervisor exits with these): the refusal was recorded in detail, or withheld and only to
# be counted in its caller's summary of launch refusals (the order's refusal_detailed was False).
REFUSAL_RECORDED = 3
REFUSAL_COUNTED = 4


@dataclass(frozen=True)
class SessionGone:
    """The spawner to the daemon: a session's supervisor ended, with its exit status (REFUSAL_RECORDED,
    REFUSAL_COUNTED: refused before it ran), or its order was refused (125)."""

    session: str
    status: int

    def __post_init__(self) -> None:
        if not (_is_text(self.session) and self.session and _is_int(self.status)):
            raise OrderError("ended event: invalid session or status")

    def to_json(self) -> bytes:
        return _encode("ended", {"session": self.session, "status": self.status})


SpawnerEvent = SessionStarted | SessionGone
_EVENTS: dict[str, type[SessionStarted] | type[SessionGone]] = {"started": SessionStarted, "ended": SessionGone}


def read_event(data: bytes) -> SpawnerEvent:
    """A report in a frame from the spawner: {"started": {...}} or {"ended": {...}}."""
    kind, members = _decode(data, "a spawner event", _EVENTS)
    _exact_members(f"{kind} event", members, _EVENTS[kind])
    return _EVENTS[kind](**members)


def _exact_members(what: str, members: Mapping[str, Any], cls: type) -> None:
    expected = {f.name for f in fields(cls)}
    missing, unknown = expected - set(members), set(members) - expected
    if missing or unknown:
        parts = [f"missing {', '.join(sorted(missing))}"] if missing else []
        parts += [f"unknown {', '.join(sorted(unknown))}"] if unknown else []
        raise OrderError(f"{what}: {'; '.join(parts)}")


@dataclass(frozen=True)
class SpawnerConfig:
    """What the spawner and its supervisors need of the daemon's settings. Handed over when the
    spawner is forked (it never crosses a socket), and checked then."""

    audit_dir: Path
    audit_key: Path
    audit_group_ms: float
    audit_group_records: int
    production: bool
    regions: Path
    baseline: Path
    cgroup_group: str
    helper_memory_mb: int
    egress: EgressValues
    presets: Path = data.PRESETS
    spec_dir: Path | None = None  # None: the package's own schemas
    kernel_audit: bool = True
    prepared_sessions: int = 0  # supervisors forked before their order (see spawner.py); 0: none

    def __post_init__(self) -> None:
        checks = {
            "audit_dir": isinstance(self.audit_dir, Path),
            "audit_key": isinstance(self.audit_key, Path),
            "audit_group_ms": _is_number(self.audit_group_ms),
            "audit_group_records": _is_int(self.audit_group_records),
            "production": isinstance(self.production, bool),
            "regions": isinstance(self.regions, Path),
            "baseline": isinstance(self.baseline, Path),
            "cgroup_group": _is_text(self.cgroup_group) and bool(self.cgroup_group),
            "helper_memory_mb": _is_int(self.helper_memory_mb) and self.helper_memory_mb > 0,
            "egress": isinstance(self.egress, EgressValues),
            "presets": isinstance(self.presets, Path),
            "spec_dir": self.spec_dir is None or isinstance(self.spec_dir, Path),
            "kernel_audit": isinstance(self.kernel_audit, bool),
            "prepared_sessions": _is_int(self.prepared_sessions) and 0 <= self.prepared_sessions <= 16,
        }
        wrong = [name for name, ok in checks.items() if not ok]
        if wrong:
            raise OrderError(f"spawner configuration: invalid {', '.join(wrong)}")
