"""adl-exec in embedded mode: the session is launched here, by this process (enforcer/launching.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import launching
from .. import session as sessions
from ..audit import AuditWriter
from ..policy.model import Policy
from ..sandbox import identity
from ..sandbox.plan import LaunchPlan
from ..sandbox.stage import Prepared
from ..settings.launch import LaunchSettings
from .exec_common import print_report, refuse

if TYPE_CHECKING:
    import argparse

    from .exec_args import EmbeddedArgs
    from .exec_learn import Learner


class _Embedded:
    """What embedded adl-exec adds to the launch: warnings on stderr, learn mode."""

    def __init__(self, args: argparse.Namespace | EmbeddedArgs, session: str, cgroup_group: str) -> None:
        self.args, self.session, self.cgroup_group = args, session, cgroup_group
        self.learner: Learner | None = None

    def warn(self, message: str) -> None:
        print(f"adl-exec: warning: {message}", file=sys.stderr)

    def planned(self, compiled: launching.CompiledPolicy, plan: LaunchPlan) -> None:
        if not getattr(self.args, "learn", None):  # Learner.begin's own test: None unless --learn
            return
        from .exec_learn import Learner  # fanotify, the learner and the log reader: learn mode only

        self.learner = Learner.begin(
            self.args, compiled.adl_document, plan, self.session, self.args.explain, self.cgroup_group
        )

    def ended(self, audit_dir: Path) -> dict[str, Any] | None:
        return self.learner.finish(audit_dir) if self.learner is not None else None


def run_embedded(
    args: argparse.Namespace | EmbeddedArgs,
    command: list[str],
    session_id: str,
    prepared: Prepared | None,
    settings: LaunchSettings,
) -> int:
    """Compile, plan, audit and run; `prepared` is the stage forked ahead (None with --explain)."""
    # The egress settings (pydantic) are validated only when the plan has a network layer; the
    # home region, which residency rules compile against, is one of them.
    # Documents compiled before (same bytes, baseline, region map, host) come from the cache.
    policy = launching.PolicyFiles(
        args.adl,
        args.aaif,
        args.regions or settings.regions,
        args.baseline or settings.baseline,
        production=args.production,
        home_region=settings.home_region,
        cache_dir=settings.cache_dir,
        spec_dir=settings.spec_dir,
    )
    request = launching.LaunchRequest(
        session=session_id,
        argv=tuple(command),
        environ=dict(os.environ),  # the caller's environment: the agent's is chosen from it
        policy=policy,
        user=args.user,
        accept_unenforced=frozenset(args.accept_unenforced),
        pids_max=args.pids_max,
        egress=settings.egress,
        cgroup_group=settings.cgroup_group,
        presets=settings.presets,
        kernel_audit=settings.kernel_audit,
        explain_only=args.explain,
        masks=_own_files(args, settings),
    )
    result = launching.launch(
        request,
        lambda: _open_writer(args, settings),
        prepared=prepared,
        observer=_Embedded(args, session_id, settings.cgroup_group),
    )
    if isinstance(result, launching.Refused):
        if result.unaudited:
            print(f"adl-exec: warning: {result.unaudited}", file=sys.stderr)
        return refuse(result.reason)
    if isinstance(result, launching.Explained):
        _print_explain(result.policy, result.plan, args.json, _explain_identity(args.user), settings.kernel_audit)
        return 0
    if isinstance(result, launching.Terminated):  # nothing terminates an embedded launch but a signal
        return refuse(f"terminated {result.step}")
    outcome = result.outcome
    if args.report:
        print_report(
            {
                "session": session_id,
                "reason": outcome.reason,
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "duration_ms": int(outcome.duration_s * 1000),
                "creations_refused": outcome.guard_refused_total,
                "kernel_denials": result.kernel_denials,
                "audit_dir": str(result.audit_dir),
            },
            args.json,
        )
    return outcome.exit_code


def _explain_identity(spec: str | None) -> dict[str, object]:
    try:
        chosen = identity.resolve(spec, os.geteuid(), os.getegid(), os.environ)
    except identity.IdentityError as exc:
        return {"refused": str(exc)}
    return {"uid": chosen.uid, "gid": chosen.gid, "from": chosen.source}


def _own_files(args: argparse.Namespace | EmbeddedArgs, settings: LaunchSettings) -> launching.Masks:
    """The audit log and signing key, hidden from the session whatever its grants say (as the daemon
    hides its own): with the key an agent could re-seal an edited log. Only file modes protect them
    otherwise, and none do when the agent runs as the user adl-exec runs as."""
    directory = Path(os.path.abspath(args.audit_dir or settings.audit_dir))
    key = Path(os.path.abspath(args.audit_key or settings.audit_key))
    detail = f"adl-exec's audit log {directory} and signing key {key} are masked"
    return launching.Masks((directory,), (key,), "own_files", detail)


def _open_writer(args: argparse.Namespace | EmbeddedArgs, settings: LaunchSettings) -> AuditWriter:
    return AuditWriter(args.audit_dir or settings.audit_dir, args.audit_key or settings.audit_key, source="adl-exec")


def _kernel_denials_plan(plan: LaunchPlan, record: bool) -> str:
    if not record:
        return "not recorded (turned off with ADL_ENFORCER_KERNEL_AUDIT)"
    from ..sandbox import kernel_audit

    return kernel_audit.describe(plan.landlock.abi)


def _print_explain(
    policy: Policy, plan: LaunchPlan, as_json: bool, agent: dict[str, object], kernel_audit: bool
) -> None:
    from ..explain import policy_summary, render_policy

    if as_json:
        print(
            json.dumps(
                {
                    "policy": policy_summary(policy),
                    "command": plan.executable,
                    "argv": plan.argv,
                    "layers": sessions.layers_json(plan),
                    "accepted_unenforced": plan.accepted_unenforced,
                    "refusals": plan.refusals,
                    "identity": agent,
                    "kernel_denials": _kernel_denials_plan(plan, kernel_audit),
                },
                indent=2,
            )
        )
        return
    print(render_policy(policy))
    print()
    print(f"command: {plan.executable} (argv {plan.argv})")
    if "uid" in agent:
        print(f"runs as: uid {agent['uid']}, gid {agent['gid']} (from {agent['from']})")
    print("layers:")
    for layer in plan.layers:
        print(f"  {layer.name:<13} {layer.status:<20} {layer.mechanism}")
        for line in layer.details:
            print(f"      {line}")
    print(f"kernel denials: {_kernel_denials_plan(plan, kernel_audit)}")
    for refusal in [*plan.refusals, *([agent["refused"]] if "refused" in agent else [])]:
        print(f"a launch would be refused: {refusal}")
