"""Pending human approvals: opened by an ASK decision, closed by Approve, Reject or expiry (a denial).

Thread-safe. Time comes from the caller's clock so tests can move it. Resolution callbacks run
outside the lock; the daemon uses them to audit the outcome before anyone is told about it.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Outcome = Literal["pending", "approved", "rejected", "expired"]


class ApprovalError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # not_found | already_resolved | too_many


@dataclass(frozen=True)
class Approval:
    approval_id: str
    decision_id: str
    agent: str
    session: str
    tool: str
    arguments: Any  # masked
    reasons: tuple[Any, ...]
    created_ms: int
    expires_ms: int
    outcome: Outcome = "pending"
    approver: str = ""
    note: str = ""
    uid: int | None = None  # the uid of the session that asked (None: a call without a session)
    receipt: Any = field(default=None, compare=False)


class Approvals:
    def __init__(
        self,
        clock_ms: Callable[[], int],
        limit: int = 10_000,
        *,
        per_agent: int | None = None,
        per_uid: int | None = None,
    ) -> None:
        self._clock_ms = clock_ms
        self._limit = limit
        self._per_agent = per_agent or limit
        self._per_uid = per_uid or limit
        self._items: dict[str, Approval] = {}
        # Pending approvals counted by ("all", None), ("agent", key) and ("uid", uid).
        self._pending_by: dict[tuple[str, Any], int] = {}
        self._lock = threading.Condition()
        self._closed = False

    def open(self, **fields: Any) -> Approval:
        """A new pending approval; ApprovalError("too_many") when the limit of all agents, of this
        agent or of this uid is reached (each bound separately, so one flood leaves others room)."""
        with self._lock:
            pending = self._pending_by.get(("all", None), 0)
            agent_key, uid_key = ("agent", fields["agent"]), ("uid", fields.get("uid"))
            if pending >= self._limit:
                raise ApprovalError("too_many", f"{self._limit} approvals are already pending")
            if self._pending_by.get(agent_key, 0) >= self._per_agent:
                raise ApprovalError(
                    "too_many", f"agent {fields['agent']!r} already has {self._per_agent} approvals pending"
                )
            if uid_key[1] is not None and self._pending_by.get(uid_key, 0) >= self._per_uid:
                raise ApprovalError("too_many", f"uid {uid_key[1]} already has {self._per_uid} approvals pending")
            approval = Approval(approval_id="apr-" + secrets.token_hex(10), created_ms=self._clock_ms(), **fields)
            self._items[approval.approval_id] = approval
            self._count(approval, 1)
            return approval

    def _count(self, approval: Approval, delta: int) -> None:
        for key in (("all", None), ("agent", approval.agent), ("uid", approval.uid)):
            if key[0] == "uid" and key[1] is None:
                continue
            left = self._pending_by.get(key, 0) + delta
            if left:
                self._pending_by[key] = left
            else:
                self._pending_by.pop(key, None)

    def get(self, approval_id: str) -> Approval | None:
        with self._lock:
            return self._items.get(approval_id)

    def pending(self, agent: str | None = None) -> list[Approval]:
        with self._lock:
            return [a for a in self._items.values() if a.outcome == "pending" and (not agent or a.agent == agent)]

    def resolve(
        self,
        approval_id: str,
        outcome: Outcome,
        approver: str,
        note: str,
        record: Callable[[Approval], Any],
    ) -> Approval:
        """Close one approval. `record(approval)` runs first (the audit append); if it raises, the
        approval stays pending and the error propagates."""
        with self._lock:
            current = self._items.get(approval_id)
            if current is None:
                raise ApprovalError("not_found", f"no approval {approval_id!r}")
            if current.outcome != "pending":
                raise ApprovalError("already_resolved", f"approval {approval_id} is already {current.outcome}")
            closed = replace(current, outcome=outcome, approver=approver, note=note)
            closed = replace(closed, receipt=record(closed))
            self._items[approval_id] = closed
            self._count(current, -1)
            self._lock.notify_all()
            return closed

    def wait(self, approval_id: str, timeout_s: float) -> Approval | None:
        """The approval once it is no longer pending, or as it stands after timeout_s (or at once
        after close())."""
        with self._lock:
            self._lock.wait_for(
                lambda: self._closed or (a := self._items.get(approval_id)) is None or a.outcome != "pending",
                timeout=timeout_s,
            )
            return self._items.get(approval_id)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter for good: the daemon is stopping (its pending approvals are resolved first)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def of_session(self, session: str) -> list[Approval]:
        with self._lock:
            return [a for a in self._items.values() if a.outcome == "pending" and a.session == session]

    def due(self) -> list[Approval]:
        """Pending approvals whose time is up (the caller expires each with resolve())."""
        now = self._clock_ms()
        with self._lock:
            return [a for a in self._items.values() if a.outcome == "pending" and a.expires_ms <= now]

    def forget_resolved(self, older_than_ms: int) -> None:
        """Drop resolved approvals whose expiry passed long enough ago that no runtime still waits."""
        cutoff = self._clock_ms() - older_than_ms
        with self._lock:
            for key in [k for k, a in self._items.items() if a.outcome != "pending" and a.expires_ms < cutoff]:
                del self._items[key]
