"""adl-exec in embedded mode: compile the documents, plan, audit and run the session here."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from pathlib import Path

from .. import paths, policy_cache
from ..audit import AuditUnavailable, AuditWriter
from ..documents import PolicyFileError
from ..policy.errors import DocumentRejected
from ..policy.model import Policy
from ..sandbox import session as sessions
from ..sandbox.launcher import LaunchError
from ..sandbox.plan import PlanError, build_plan
from ..sandbox.stage import Prepared
from .exec import DEFAULT_BASELINE, print_report, refuse


def _user(spec: str | None) -> tuple[int | None, int | None]:
    if spec is None:
        return None, None
    try:
        entry = pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
    except (KeyError, ValueError):
        raise PlanError(f"--user {spec}: no such user") from None
    return entry.pw_uid, entry.pw_gid


def run_embedded(args: argparse.Namespace, command: list[str], session_id: str, prepared: Prepared | None) -> int:
    """Compile, plan, audit and run; `prepared` is the stage forked ahead (None with --explain)."""
    policy: Policy | None = None
    try:
        features = sessions.host_features()
        # The egress settings (pydantic-settings) load only when the plan has a network layer; the
        # home region, which residency rules compile against, is the same variable they read.
        # Documents compiled before (same bytes, baseline, region map, host) come from the cache.
        loaded = policy_cache.load(
            args.adl,
            args.aaif,
            args.regions,
            args.baseline or Path(os.environ.get("ADL_ENFORCER_BASELINE", DEFAULT_BASELINE)),
            production=args.production,
            home_region=os.environ.get("ADL_ENFORCER_HOME_REGION") or None,
            features=features,
        )
        if loaded.warning:
            print(f"adl-exec: warning: {loaded.warning}", file=sys.stderr)
        policy, baseline = loaded.policy, loaded.baseline
        uid, gid = _user(args.user)
        plan = build_plan(
            policy,
            command,
            baseline=baseline,
            environ=dict(os.environ),
            features=features,
            accept_unenforced=frozenset(args.accept_unenforced),
            pids_max=args.pids_max,
            explain_only=args.explain,
        )
    except (PolicyFileError, DocumentRejected, PlanError, OSError) as exc:
        reason = str(exc)
        if not args.explain:
            _audit_refusal(args, policy, session_id, reason, command)
        return refuse(reason)
    if args.explain:
        _print_explain(policy, plan, args.json)
        return 0
    for domain in plan.accepted_unenforced:
        print(f"adl-exec: warning: '{domain}' is NOT enforced (accepted with --accept-unenforced)", file=sys.stderr)
    try:
        writer = _open_writer(args)
    except AuditUnavailable as exc:
        return refuse(f"audit log unavailable, nothing runs unrecorded: {exc}")
    try:
        outcome = sessions.run_session(policy, plan, writer, session_id, uid=uid, gid=gid, prepared=prepared)
    except LaunchError as exc:
        _safe_refusal(writer, policy, session_id, str(exc), command)
        return refuse(str(exc))
    except AuditUnavailable as exc:
        return refuse(f"audit log failed: {exc}")
    finally:
        writer.close()
    if args.report:
        print_report(
            {
                "session": session_id,
                "reason": outcome.reason,
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "duration_ms": int(outcome.duration_s * 1000),
                "creations_refused": outcome.guard_refused_total,
            },
            args.json,
        )
    return outcome.exit_code


def _open_writer(args: argparse.Namespace) -> AuditWriter:
    return AuditWriter(args.audit_dir or paths.audit_dir(), args.audit_key or paths.audit_key_path(), source="adl-exec")


def _audit_refusal(args: argparse.Namespace, policy: Policy | None, session: str, reason: str, argv: list[str]) -> None:
    try:
        writer = _open_writer(args)
    except AuditUnavailable as exc:
        print(f"adl-exec: warning: refusal not audited: {exc}", file=sys.stderr)
        return
    _safe_refusal(writer, policy, session, reason, argv)
    writer.close()


def _safe_refusal(writer: AuditWriter, policy: Policy | None, session: str, reason: str, argv: list[str]) -> None:
    try:
        sessions.record_refusal(writer, policy, session, reason, argv)
    except AuditUnavailable as exc:
        print(f"adl-exec: warning: refusal not audited: {exc}", file=sys.stderr)


def _print_explain(policy: Policy, plan: sessions.LaunchPlan, as_json: bool) -> None:
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
                },
                indent=2,
            )
        )
        return
    print(render_policy(policy))
    print()
    print(f"command: {plan.executable} (argv {plan.argv})")
    print("layers:")
    for layer in plan.layers:
        print(f"  {layer.name:<13} {layer.status:<20} {layer.mechanism}")
        for line in layer.details:
            print(f"      {line}")
    for refusal in plan.refusals:
        print(f"a launch would be refused: {refusal}")
