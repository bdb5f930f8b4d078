"""One agent session from its plan: audit the launch, run, audit the exit and the signed session
evidence. enforcer/launching.py, the launch path embedded adl-exec and the daemon's spawner share,
runs it."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from .audit import Appender, AuditWriter, Entry, Masker, Receipt, events, records
from .audit.evidence import EvidenceEvent, build_evidence
from .audit.records import format_ts
from .egress import netns
from .policy import Policy
from .sandbox import cgroups, identity, landlock, launcher
from .sandbox.denials import SessionDenials
from .sandbox.plan import HostFeatures, LaunchPlan
from .sandbox.stage import Prepared

# Outcome reason -> (evidence cause, action, outcome)
_EVIDENCE = {
    "timeout": ("on_timeout", "halt", "halted"),
    "oom": ("on_memory_limit", "halt", "halted"),
    "pids_limit": ("on_pids_limit", "halt", "halted"),
    "signal": ("on_signal", "halt", "halted"),
}


def host_features() -> HostFeatures:
    return HostFeatures(
        landlock_abi=landlock.abi_version(), cgroups=cgroups.detect(), egress_tools_missing=tuple(netns.missing_tools())
    )


def layers_json(plan: LaunchPlan) -> list[dict[str, Any]]:
    return [asdict(layer) for layer in plan.layers]


def record_refusal(
    writer: Appender,
    policy: Policy | None,
    session: str,
    reason: str,
    argv: list[str],
    caller: Mapping[str, Any] | None = None,
) -> None:
    """`caller`: events.caller_fields() of the daemon's caller, added to the record."""
    payload = events.refusal_payload(policy, reason, argv)
    writer.append(records.REFUSED, {**payload, **(caller or {})}, corr=session, priority="high", sync=True)


def run_session(
    policy: Policy,
    plan: LaunchPlan,
    writer: AuditWriter,
    session: str,
    *,
    uid: int | None = None,
    gid: int | None = None,
    governor: str | None = None,
    cgroup_group: str = cgroups.GROUP,
    prepared: Prepared | None = None,
    on_denials: Callable[[dict[str, Any]], None] | None = None,
    caller: Mapping[str, Any] | None = None,
    kernel_audit: bool = True,
    before_start: Callable[[], None] | None = None,
) -> launcher.Outcome:
    """Audit the launch (synchronously: nothing runs unrecorded), run, audit the outcome. `prepared`:
    the stage forked ahead (stage.prepare()); without it the launcher forks one. A prepared stage
    without a network that is ready gets its order first: the launch record is written and synced,
    and the kernel-audit reader started, while it sets the sandbox up; its agent waits for them. uid/gid: the
    identity to switch to (see identity.py); None keeps this process's, which must not be root.
    `caller`: events.caller_fields() of the daemon's caller, added to the launch record.
    `before_start`: called before this process forks (the egress filter) or starts the agent; an
    OSError it raises is a LaunchError."""
    agent_uid = uid if uid is not None else os.geteuid()
    agent_gid = gid if gid is not None else os.getegid()
    if agent_uid == 0 or agent_gid == 0:
        raise launcher.LaunchError(
            f"{identity.ROOT_REFUSAL}; with adl-exec --daemon, launch from the account the agent should run as"
        )
    # Before the launch record and the egress filter: a refused launch starts and records nothing.
    launcher.refuse_if_refused(prepared)
    start_ns = time.time_ns()
    # The group the prepared stage joined, whatever this call's default says.
    joined = prepared.group.directories[0].parent.name if prepared is not None and prepared.group else cgroup_group
    pids = prepared.stage.session_pids if prepared is not None else None
    started = _Started(writer, lambda: _record_launch(writer, policy, plan, session, (agent_uid, agent_gid), caller))

    def start_reader() -> SessionDenials:
        # Host side, before the agent starts: the reader's socket buffers its denials until read.
        return SessionDenials.start(writer, policy, session, pids, joined, record=kernel_audit)

    # A prepared stage that is ready gets its order first (see launcher.run: before_agent runs once
    # the order is sent): the launch record and the reader's start then overlap its set-up. One
    # still getting ready (its cgroup join, its forks) would keep this process waiting: the record
    # is written meanwhile instead.
    if prepared is None or plan.egress is not None or not prepared.stage.ready():
        started.record(start_reader)

    def before_agent() -> None:
        started.record(start_reader)
        # The launch record on stable storage: nothing runs unrecorded. The stage, which waits for
        # this to return before it execs the agent, sets the sandbox up meanwhile.
        started.sync()
        if before_start is not None:
            try:
                before_start()
            except OSError as exc:
                raise launcher.LaunchError(str(exc)) from exc

    try:
        outcome, network = _run(
            policy, plan, writer, session, prepared, cgroup_group, switch_to=(uid, gid), before_agent=before_agent
        )
    except BaseException:
        # A launch that failed (its filter did not start, its stage died) still stops the reader and
        # records what it saw; the launch's own error is the one raised.
        if started.reader is not None:
            with contextlib.suppress(Exception):
                started.reader.finish()
        raise
    if not started.synced or started.reader is None:  # _run calls before_agent before the agent starts
        raise launcher.LaunchError("the session ran without its launch record on stable storage")
    kernel_denials = started.reader
    denials = _denials_summary(kernel_denials, plan)
    if on_denials is not None:
        on_denials(denials)
    end_ns = time.time_ns()
    # The session's end in one write and one sync: the creation guard's refusals, the exit record
    # and the signed evidence are durable together before anyone is told how the session ended.
    ending = _exit_entries(policy, session, outcome, network, denials)
    ending.append(_evidence_entry(writer, policy, plan, session, outcome, (start_ns, end_ns), governor))
    writer.append_many(ending, sync=True)
    return outcome


class _Started:
    """A session's launch record and kernel-audit reader, made once, whichever comes first: the
    stage's order or the agent's start; and whether the record reached stable storage."""

    def __init__(self, writer: AuditWriter, write_record: Callable[[], Receipt]) -> None:
        self.writer, self.write_record = writer, write_record
        self.receipt: Receipt | None = None
        self.reader: SessionDenials | None = None
        self.synced = False

    def record(self, start_reader: Callable[[], SessionDenials]) -> None:
        if self.receipt is None:
            self.receipt = self.write_record()
            self.reader = start_reader()

    def sync(self) -> None:
        assert self.receipt is not None
        self.writer.sync(self.receipt.seq)
        self.synced = True


def _record_launch(
    writer: Appender,
    policy: Policy,
    plan: LaunchPlan,
    session: str,
    account: tuple[int, int],
    caller: Mapping[str, Any] | None,
) -> Receipt:
    """Written, not yet synced: run_session syncs it before the agent may start."""
    payload = events.launch_payload(
        policy,
        Masker(plan.secrets),
        argv=plan.argv,
        command=plan.executable,
        layers=layers_json(plan),
        accepted_unenforced=plan.accepted_unenforced,
        baseline_path=str(plan.baseline.path),
        baseline_digest=plan.baseline.digest,
        env_passed=plan.env,
        env_dropped=plan.env_dropped,
        uid=account[0],
        gid=account[1],
    )
    return writer.append(records.LAUNCH, {**payload, **(caller or {})}, corr=session)


def _run(
    policy: Policy,
    plan: LaunchPlan,
    writer: AuditWriter,
    session: str,
    prepared: Prepared | None,
    cgroup_group: str,
    *,
    switch_to: tuple[int | None, int | None],
    before_agent: Callable[[], None],
) -> tuple[launcher.Outcome, dict[str, Any] | None]:
    """The agent, behind its egress filter when the plan has a network layer; the outcome and the
    filter's summary (None without one). `switch_to`: the uid/gid the launcher switches to, None
    for this process's own. `before_agent`: what must precede the agent's start and this
    process's next fork."""
    uid, gid = switch_to
    if plan.egress is None and prepared is not None:  # the launcher forks nothing of its own here
        outcome = launcher.run(
            plan, session, prepared=prepared, uid=uid, gid=gid, cgroup_group=cgroup_group, before_agent=before_agent
        )
        return outcome, None
    before_agent()
    if plan.egress is None:
        outcome = launcher.run(plan, session, prepared=prepared, uid=uid, gid=gid, cgroup_group=cgroup_group)
        return outcome, None
    from .egress import process as egress  # dnspython and the filter: only for sessions with a network

    try:
        filter_process = egress.start(
            policy, plan.egress, egress.AuditTarget(writer.directory, writer.key_path, writer.settings), session
        )
    except egress.EgressError as exc:
        raise launcher.LaunchError(str(exc)) from exc
    try:
        outcome = launcher.run(
            plan,
            session,
            prepared=prepared,
            uid=uid,
            gid=gid,
            cgroup_group=cgroup_group,
            netns_fd=filter_process.netns_fd,
        )
    finally:
        network = filter_process.stop()
    return outcome, network


def _denials_summary(kernel_denials: SessionDenials, plan: LaunchPlan) -> dict[str, Any]:
    denials = kernel_denials.finish()
    if denials.get("available") and plan.landlock.abi < 7:
        denials["landlock"] = f"ABI {plan.landlock.abi} does not report its denials (7 does): seccomp's only"
    return denials


def _exit_entries(
    policy: Policy,
    session: str,
    outcome: launcher.Outcome,
    network: dict[str, Any] | None,
    denials: dict[str, Any],
) -> list[Entry]:
    """The creation guard's refusals (one decision each), then the exit record."""
    entries = [
        Entry(records.DECISION, events.guard_refusal_payload(policy, refusal), session, priority="high")
        for refusal in outcome.guard_refusals
    ]
    payload = events.exit_payload(
        policy,
        reason=outcome.reason,
        exit_code=outcome.exit_code,
        signal=outcome.signal,
        duration_s=outcome.duration_s,
        pid=outcome.pid,
        creations_refused=outcome.guard_refused_total,
        creations_recorded=len(outcome.guard_refusals),
        kernel_denials=denials,
        network=network,
        cleanup_error=outcome.cleanup_error,
    )
    entries.append(Entry(records.EXIT, payload, session, priority=events.exit_priority(outcome.reason)))
    return entries


def _evidence_entry(
    writer: AuditWriter,
    policy: Policy,
    plan: LaunchPlan,
    session: str,
    outcome: launcher.Outcome,
    span_ns: tuple[int, int],
    governor: str | None,
) -> Entry:
    """The session's signed evidence record (its start, end, limits and how it ended)."""
    start_ns, end_ns = span_ns
    evidence_events = []
    if outcome.reason in _EVIDENCE:
        cause, action, _ = _EVIDENCE[outcome.reason]
        evidence_events.append(EvidenceEvent(cause, action, format_ts(end_ns), {"exit_code": outcome.exit_code}))
    evidence = build_evidence(
        governor=governor or f"did:web:{socket.gethostname()}",
        agent_id=events.agent_of(policy),
        passport_digest=policy.digest,
        session=session,
        tier="R2" if plan.accepted_unenforced else "R3",
        start=format_ts(start_ns),
        end=format_ts(end_ns),
        iat=format_ts(time.time_ns()),
        limits={
            "memory_bytes": plan.limits.memory_bytes,
            "cpu_percent": plan.limits.cpu_percent,
            "pids_max": plan.limits.pids_max,
            "max_duration_sec": plan.timeout_s,
            "not_enforced": plan.residual,
        },
        events=evidence_events,
        outcome=_EVIDENCE.get(outcome.reason, ("", "", "completed"))[2],
        key=writer.signing_key,
    )
    return Entry(records.EVIDENCE, events.evidence_payload(policy, evidence), session)
