"""adl-exec in embedded mode: compile the documents, plan, audit and run the session here."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import paths, policy_cache
from .. import session as sessions
from ..audit import AuditUnavailable, AuditWriter, records
from ..audit.events import agent_of
from ..documents import PolicyFileError
from ..policy.errors import Refusal
from ..policy.model import Policy
from ..sandbox import identity, runtime_presets
from ..sandbox.launcher import LaunchError
from ..sandbox.plan import PlanError, build_plan
from ..sandbox.stage import Prepared
from .exec_common import DEFAULT_BASELINE, print_report, refuse
from .exec_learn import Learner


def _identity(spec: str | None) -> tuple[int | None, int | None]:
    """The uid/gid the stage switches to; None, None when the agent runs as this (unprivileged) process."""
    try:
        chosen = identity.resolve(spec, os.geteuid(), os.getegid(), os.environ)
    except identity.IdentityError as exc:
        raise PlanError(str(exc)) from None
    if chosen.uid == os.geteuid() and chosen.gid == os.getegid():
        return None, None
    return chosen.uid, chosen.gid


def _parsed(data: bytes, path: Path) -> dict:
    """The ADL document as a mapping: JSON directly, YAML through the loader."""
    try:
        document = json.loads(data)
    except ValueError:
        from ..documents import document_from_bytes

        return document_from_bytes(data, str(path), "adl")
    if not isinstance(document, dict):
        raise PolicyFileError(str(path), "not an ADL document")
    return document


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
        policy = loaded.policy
        # The presets a document asks for and learn mode read the document itself: the very bytes
        # the policy was compiled from, parsed without the validation code a warm launch skips.
        adl_document = _parsed(loaded.adl_bytes, args.adl)
        baseline, presets_applied = runtime_presets.extend(loaded.baseline, adl_document)
        uid, gid = _identity(args.user) if not args.explain else (None, None)
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
        remove_session_tmp = runtime_presets.finish_plan(
            plan, presets_applied, uid=uid, gid=gid, explain_only=args.explain
        )
        learner = Learner.begin(args, adl_document, plan, session_id, args.explain)
    except (Refusal, OSError) as exc:
        reason = str(exc)
        if not args.explain:
            _audit_refusal(args, policy, session_id, reason, command)
        return refuse(reason)
    if args.explain:
        _print_explain(policy, plan, args.json, _explain_identity(args.user))
        return 0
    for domain in plan.accepted_unenforced:
        print(f"adl-exec: warning: '{domain}' is NOT enforced (accepted with --accept-unenforced)", file=sys.stderr)
    try:
        writer = _open_writer(args)
    except AuditUnavailable as exc:
        remove_session_tmp()
        return refuse(f"audit log unavailable, nothing runs unrecorded: {exc}")
    denials: dict = {}
    try:
        outcome = sessions.run_session(
            policy, plan, writer, session_id, uid=uid, gid=gid, prepared=prepared, on_denials=denials.update
        )
        if learner is not None:
            learned = {"agent": agent_of(policy), **learner.finish(writer.directory)}
            writer.append(records.DECISION, learned, corr=session_id, priority="high", sync=True)
    except LaunchError as exc:
        _safe_refusal(writer, policy, session_id, str(exc), command)
        return refuse(str(exc))
    except AuditUnavailable as exc:
        return refuse(f"audit log failed: {exc}")
    finally:
        writer.close()
        remove_session_tmp()
    if args.report:
        print_report(
            {
                "session": session_id,
                "reason": outcome.reason,
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "duration_ms": int(outcome.duration_s * 1000),
                "creations_refused": outcome.guard_refused_total,
                "kernel_denials": denials,
                "audit_dir": str(writer.directory),
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


def _kernel_denials_plan(plan: sessions.LaunchPlan) -> str:
    if os.environ.get("ADL_ENFORCER_KERNEL_AUDIT", "").lower() in ("0", "off", "no", "false"):
        return "not recorded (turned off with ADL_ENFORCER_KERNEL_AUDIT)"
    from ..sandbox import kernel_audit

    return kernel_audit.describe(plan.landlock.abi)


def _print_explain(policy: Policy, plan: sessions.LaunchPlan, as_json: bool, agent: dict[str, object]) -> None:
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
                    "kernel_denials": _kernel_denials_plan(plan),
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
    print(f"kernel denials: {_kernel_denials_plan(plan)}")
    for refusal in [*plan.refusals, *([agent["refused"]] if "refused" in agent else [])]:
        print(f"a launch would be refused: {refusal}")
