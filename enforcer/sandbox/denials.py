"""A session's kernel denials in its audit log: one `decision` record per distinct denial, floods
counted and summarised, never written one by one.

Bounds, per session: at most `max_detailed` decision records (distinct denials; a repeat of the same
right on the same object by the same program is counted, not recorded), no more than `burst` of them
at once and `per_s` a second after that, and one summary record per `summary_every_s` while
denials are being suppressed, each with at most `top` entries. So the log grows by a bounded amount
whatever the agent does; the counts stay exact (save datagrams the kernel dropped, counted as lost).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ..audit import records
from ..audit.events import agent_of, denial_tally
from ..policy import Policy
from ..quick_dataclass import dataclass
from . import kernel_audit

if TYPE_CHECKING:
    from ..policy.grants import Grant

MAX_TEXT = 512


def _short(value: str | None) -> str | None:
    return value if value is None or len(value) <= MAX_TEXT else value[: MAX_TEXT - 3] + "..."


@dataclass
class Limits:
    max_detailed: int = 256
    burst: int = 64
    per_s: float = 20.0
    summary_every_s: float = 10.0
    top: int = 20


@dataclass
class _Seen:
    count: int = 0
    grant: Grant | None = None
    first: dict[str, Any] = field(default_factory=dict)


def _syscall_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        from .seccomp import pyseccomp

        sc = pyseccomp()
        return sc.resolve_syscall(sc.Arch.NATIVE, number).decode()
    except Exception:  # an unknown number is shown as a number
        return str(number)


class DenialLog:
    """The sink for kernel_audit.Reader: decides what becomes a record. Thread-safe."""

    def __init__(
        self,
        appender: Any,
        policy: Policy,
        session: str,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.appender = appender
        self.policy = policy
        self.agent = agent_of(policy)
        self.session = session
        self.limits = limits or Limits()
        self.clock = clock
        self.seen: dict[tuple[Any, ...], _Seen] = {}
        self.total = 0
        self.recorded = 0
        self.suppressed_since_summary = 0
        self.summaries = 0
        self.unkeyed = 0  # distinct denials beyond what is kept by key
        self.errors: list[str] = []
        self._tokens = float(self.limits.burst)
        self._refilled = clock()
        self._last_summary = clock()
        self._lock = threading.Lock()

    # -- the sink --------------------------------------------------------------------------------

    def __call__(self, denial: kernel_audit.Denial) -> None:
        with self._lock:
            self.total += 1
            key = self._key(denial)
            seen = self.seen.get(key)
            if seen is None:
                if len(self.seen) >= self.limits.max_detailed * 4:
                    self.unkeyed += 1
                    self._maybe_summary()
                    return
                seen = self.seen[key] = _Seen()
            seen.count += 1
            if seen.count == 1 and self.recorded < self.limits.max_detailed and self._take_token():
                payload = self._payload(denial)
                seen.grant = self._grant(denial)
                payload.update(self._grant_fields(seen.grant))
                seen.first = payload
                self._append(records.DECISION, payload)
                self.recorded += 1
            else:
                if seen.count == 1:
                    seen.grant = self._grant(denial)
                    seen.first = {**self._payload(denial), **self._grant_fields(seen.grant)}
                self.suppressed_since_summary += 1
                self._maybe_summary()

    def _key(self, d: kernel_audit.Denial) -> tuple[Any, ...]:
        return (d.mechanism, d.blockers, d.path, d.port, d.syscall if d.mechanism == "seccomp" else None, d.exe)

    def _take_token(self) -> bool:
        now = self.clock()
        self._tokens = min(float(self.limits.burst), self._tokens + (now - self._refilled) * self.limits.per_s)
        self._refilled = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def _grant(self, d: kernel_audit.Denial) -> Grant:
        from ..policy.grants import explain_landlock, explain_seccomp  # only a session with denials

        if d.mechanism == "seccomp":
            return explain_seccomp(_syscall_name(d.syscall))
        return explain_landlock(self.policy, d.blockers, d.path, d.port)

    @staticmethod
    def _grant_fields(grant: Grant) -> dict[str, Any]:
        return {
            "access": grant.access,
            "rules": [r["rule"] for r in grant.rules] or ["kernel.denied"],
            "reasons": list(grant.rules),
            "grant": grant.grant,
            "hint": grant.text,
        }

    def _payload(self, d: kernel_audit.Denial) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "agent": self.agent,
            "decision": "deny",
            "enforced_by": f"{d.mechanism} (kernel)",
            "mechanism": d.mechanism,
            "pid": d.pid,
            "command": _short(d.comm),
            "exe": _short(d.exe),
            "kernel_ts": d.ts,
        }
        if d.mechanism == "landlock":
            payload.update(blockers=list(d.blockers), domain=d.domain)
            if d.path is not None:
                payload["path"] = _short(d.path)
            if d.port is not None:
                payload.update(port=d.port, address=d.address)
        if d.syscall is not None:
            payload["syscall"] = _syscall_name(d.syscall)
        return payload

    def _append(self, kind: str, payload: dict[str, Any]) -> None:
        try:
            self.appender.append(kind, payload, corr=self.session, priority="high")
        except Exception as exc:  # the session goes on; the exit record says what was not written
            if len(self.errors) < 8:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _maybe_summary(self) -> None:
        if self.clock() - self._last_summary >= self.limits.summary_every_s:
            self._append(records.DECISION, self._summary_payload(final=False))

    # -- summaries -------------------------------------------------------------------------------

    def _summary_payload(self, final: bool, lost: int = 0) -> dict[str, Any]:
        self._last_summary = self.clock()
        self.summaries += 1
        self.suppressed_since_summary = 0
        top = sorted(self.seen.values(), key=lambda s: -s.count)[: self.limits.top]
        return {
            "agent": self.agent,
            "decision": "deny",
            "enforced_by": "kernel",
            "summary": "final" if final else "interim",
            "rules": ["kernel.denials_summary"],
            "denials": self.total,
            "recorded": self.recorded,
            "not_recorded_one_by_one": self.total - self.recorded,
            "distinct_beyond_limit": self.unkeyed,
            "lost_in_kernel_socket": lost,
            "top": [denial_tally(s.count, s.first) for s in top],
        }

    def summary(self, lost: int = 0) -> dict[str, Any]:
        """For the exit record and --report."""
        with self._lock:
            top = sorted(self.seen.values(), key=lambda s: -s.count)[:10]
            return {
                "denials": self.total,
                "recorded": self.recorded,
                "lost_in_kernel_socket": lost,
                "top": [denial_tally(s.count, s.first, with_grant=True) for s in top],
                **({"record_errors": list(self.errors)} if self.errors else {}),
            }

    def close(self, lost: int = 0, kernel_lost: int = 0) -> None:
        """The final summary, when anything was left out of the one-by-one records."""
        with self._lock:
            if self.total > self.recorded or lost or kernel_lost:
                payload = self._summary_payload(final=True, lost=lost)
                payload["lost_in_kernel_queue"] = kernel_lost
                self._append(records.DECISION, payload)


TURNED_OFF = "turned off with ADL_ENFORCER_KERNEL_AUDIT"


class SessionDenials:
    """Start before the agent runs, finish after its cgroup is gone (launcher.run returned)."""

    def __init__(
        self, log: DenialLog | None, reader: kernel_audit.Reader | None, unavailable: str | None, lost_before: int = 0
    ) -> None:
        self.log, self.reader, self.unavailable = log, reader, unavailable
        self.lost_before = lost_before

    @staticmethod
    def start(
        appender: Any,
        policy: Policy,
        session: str,
        roots: Callable[[], Iterable[int]] | None,
        cgroup_group: str,
        *,
        record: bool,
    ) -> SessionDenials:
        """`roots`: the session's init and agent host pids once launched (Stage.session_pids);
        without it, only the session's cgroup identifies its processes. `record`: the kernel_audit
        setting."""
        if not record:
            # Enforcement is unchanged; only the recording of the kernel's denials is off (and says so).
            return SessionDenials(None, None, TURNED_OFF)
        try:
            changed = kernel_audit.ensure_enabled()
            lost_before = kernel_audit.status()["lost"]
            log = DenialLog(appender, policy, session)
            reader = kernel_audit.Reader(kernel_audit.Attribution(session, roots or tuple, cgroup_group), log)
        except OSError as exc:
            why = exc.strerror if isinstance(exc, kernel_audit.KernelAuditUnavailable) and exc.strerror else str(exc)
            print(f"adl-exec: kernel denials: unavailable ({why}); they are not recorded", file=sys.stderr)
            return SessionDenials(None, None, why)
        for change in changed:  # host-wide: said where the operator sees it, not only in the log
            print(f"adl-exec: note: {change} on this host, to record kernel denials; it stays on", file=sys.stderr)
        if changed:
            log._append(
                records.DECISION,
                {
                    "agent": log.agent,
                    "decision": "allow",
                    "rules": ["kernel.audit_configured"],
                    "text": "to read Landlock and seccomp denials the enforcer " + " and ".join(changed),
                },
            )
        reader.start()
        return SessionDenials(log, reader, None, lost_before)

    def finish(self) -> dict[str, Any]:
        if self.reader is None or self.log is None:
            return {"available": False, "why": self.unavailable}
        self.reader.stop()
        lost = self.reader.lost_datagrams
        try:
            # System-wide: records of any process the kernel dropped meanwhile (an upper bound).
            kernel_lost = max(0, kernel_audit.status()["lost"] - self.lost_before)
        except OSError:
            kernel_lost = 0
        self.log.close(lost, kernel_lost)
        summary = {"available": True, **self.log.summary(lost), "lost_in_kernel_queue": kernel_lost}
        if self.reader.error is not None:
            summary["reader_error"] = f"{type(self.reader.error).__name__}: {self.reader.error}"
        return summary
