"""One agent session: plan, audit the launch, run, audit the exit and the signed session evidence.
Shared by adl-exec (embedded mode) and the daemon's spawner."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from .audit import Appender, AuditWriter, Masker, records
from .audit.events import agent_of
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


def record_refusal(writer: Appender, policy: Policy | None, session: str, reason: str, argv: list[str]) -> None:
    payload: dict[str, Any] = {
        "decision": "deny",  # a refused launch is a denied action: `adl-audit search --decision deny` finds it
        "reason": "refused",
        "refusal": reason,
        "argv": Masker().mask(argv).value,
    }
    if policy is not None:
        payload.update(agent=agent_of(policy), policy_digest=policy.digest)
    writer.append(records.REFUSED, payload, corr=session, priority="high", sync=True)


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
) -> launcher.Outcome:
    """Audit the launch (synchronously: nothing runs unrecorded), run, audit the outcome. `prepared`:
    the stage forked ahead (stage.prepare()); without it the launcher forks one. uid/gid: the
    identity to switch to (see identity.py); None keeps this process's, which must not be root."""
    if (uid if uid is not None else os.geteuid()) == 0 or (gid if gid is not None else os.getegid()) == 0:
        raise launcher.LaunchError(
            f"{identity.ROOT_REFUSAL}; with adl-exec --daemon, launch from the account the agent should run as"
        )
    masker = Masker(plan.secrets)
    agent = agent_of(policy)
    start_ns = time.time_ns()
    writer.append(
        records.LAUNCH,
        {
            "agent": agent,
            "decision": "allow",
            "policy_digest": policy.digest,
            "argv": masker.mask(plan.argv).value,
            "command": plan.executable,
            "layers": layers_json(plan),
            "accepted_unenforced": plan.accepted_unenforced,
            "baseline": {"path": str(plan.baseline.path), "digest": plan.baseline.digest},
            "env_passed": sorted(plan.env),
            "env_dropped": plan.env_dropped,
            "uid": uid if uid is not None else os.geteuid(),
            "gid": gid if gid is not None else os.getegid(),
        },
        corr=session,
        sync=True,
    )
    network: dict[str, Any] | None = None
    # Host side, before the agent starts: the reader's socket buffers its denials until read.
    roots = prepared.stage.session_pids if prepared is not None else None
    # The group the prepared stage joined, whatever this call's default says.
    joined = prepared.group.directories[0].parent.name if prepared is not None and prepared.group else cgroup_group
    kernel_denials = SessionDenials.start(writer, policy, session, roots, joined)
    if plan.egress is not None:
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
    else:
        outcome = launcher.run(plan, session, prepared=prepared, uid=uid, gid=gid, cgroup_group=cgroup_group)
    denials = kernel_denials.finish()
    if denials.get("available") and plan.landlock.abi < 7:
        denials["landlock"] = f"ABI {plan.landlock.abi} does not report its denials (7 does): seccomp's only"
    if on_denials is not None:
        on_denials(denials)
    end_ns = time.time_ns()
    for refusal in outcome.guard_refusals:
        writer.append(
            records.DECISION,
            {
                "agent": agent,
                "decision": "deny",
                "enforced_by": "creation guard (seccomp user notification)",
                "syscall": refusal.get("syscall"),
                "path": refusal.get("path"),
                "pid": refusal.get("pid"),
                "rules": ["fs.denied"],
                "reasons": [{"rule": "fs.denied", "text": f"new name matches denied path '{refusal.get('pattern')}'"}],
            },
            corr=session,
            priority="high",
        )
    writer.append(
        records.EXIT,
        {
            "agent": agent,
            "reason": outcome.reason,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "duration_ms": int(outcome.duration_s * 1000),
            "pid": outcome.pid,
            "creations_refused": outcome.guard_refused_total,
            "creations_refused_unrecorded": outcome.guard_refused_total - len(outcome.guard_refusals),
            **({"network": network} if network is not None else {}),
            **({"cleanup_error": outcome.cleanup_error} if outcome.cleanup_error else {}),
            "kernel_denials": {k: v for k, v in denials.items() if k != "top"},
        },
        corr=session,
        priority="normal" if outcome.reason == "exit" else "high",
        sync=True,
    )
    events = []
    if outcome.reason in _EVIDENCE:
        cause, action, _ = _EVIDENCE[outcome.reason]
        events.append(EvidenceEvent(cause, action, format_ts(end_ns), {"exit_code": outcome.exit_code}))
    evidence = build_evidence(
        governor=governor or f"did:web:{socket.gethostname()}",
        agent_id=agent,
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
        events=events,
        outcome=_EVIDENCE.get(outcome.reason, ("", "", "completed"))[2],
        key=writer.signing_key,
    )
    writer.append(records.EVIDENCE, {"agent": agent, "evidence": evidence}, corr=session, sync=True)
    return outcome
