"""adl-exec: run a command as an agent under kernel-enforced ADL permissions."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from pathlib import Path
from typing import Any

from .. import paths
from ..audit import AuditUnavailable, AuditWriter
from ..documents import PolicyFileError, load_policy, load_regions
from ..policy import CompileOptions, DocumentRejected, Policy
from ..sandbox import session as sessions
from ..sandbox.launcher import LaunchError
from ..sandbox.plan import DOMAINS, PlanError, build_plan, load_baseline

EXIT_REFUSED = 125
DEFAULT_BASELINE = Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"

EPILOG = f"""\
Every layer is enforced by the kernel: Landlock (files, executables), a private mount namespace
(denied files masked), an empty network namespace, seccomp, cgroups (memory, CPU, pids, wall
clock), no capabilities. A layer that cannot be enforced makes adl-exec refuse, unless you accept
it with --accept-unenforced DOMAIN ({", ".join(DOMAINS)}); the acceptance is printed and audited.

examples:
  adl-exec --adl policies/examples/coding-agent.adl.json --explain -- python3 agent.py
  adl-exec --adl policies/examples/coding-agent.adl.json --report -- cat /tmp/adl-demo/workspace/notes.txt
  adl-exec --adl agent.adl.json --aaif agent.aaif.json --user nobody -- node agent.js
  adl-exec --daemon unix:/run/adl-enforcer/launch.sock --agent "Coding Agent" -- python3 agent.py

exit codes: the command's own exit code; 128+N when it was killed by signal N (timeouts and OOM
kills included, see --report); {EXIT_REFUSED} when adl-exec refused or could not set up the sandbox.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adl-exec",
        usage="adl-exec --adl FILE [options] -- COMMAND [ARGS...]",
        description="Launch a command as an agent under the permissions its ADL (and AAIF) documents declare.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--adl", type=Path, help="the agent's ADL document (JSON or YAML)")
    parser.add_argument(
        "--daemon",
        metavar="unix:PATH",
        default=os.environ.get("ADL_ENFORCER_ADDR"),
        help="ask adl-enforcerd to launch (its launch socket; default $ADL_ENFORCER_ADDR). The daemon runs "
        "the policy it holds for the agent, as your uid, in cgroups it owns, and records the session in its log",
    )
    parser.add_argument("--agent", help="with --daemon: the agent's id or name (default: taken from --adl)")
    parser.add_argument(
        "--session-file",
        type=Path,
        help="with --daemon: write the session id and its Check token here (mode 0600) for the agent's runtime",
    )
    parser.add_argument("--aaif", type=Path, help="the agent's AAIF document")
    parser.add_argument("--production", action="store_true", help="refuse draft lifecycle documents too")
    parser.add_argument("--regions", type=Path, help="region map (default: policies/regions.yaml)")
    parser.add_argument(
        "--explain", action="store_true", help="print the effective policy and every layer, run nothing"
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the outcome (exit | signal | oom | timeout | pids_limit | refused) on stderr when the command ends",
    )
    parser.add_argument("--json", action="store_true", help="--explain and --report as JSON")
    parser.add_argument(
        "--accept-unenforced",
        action="append",
        default=[],
        metavar="DOMAIN",
        choices=DOMAINS,
        help="run even though DOMAIN cannot be enforced on this host (audited)",
    )
    parser.add_argument("--user", help="run as this user (name or uid) instead of the caller's uid")
    parser.add_argument(
        "--audit-dir",
        type=Path,
        help="audit log directory (default: $ADL_ENFORCER_AUDIT_DIR, "
        "else /var/log/adl-enforcer for root, ~/.local/state/adl-enforcer/audit otherwise)",
    )
    parser.add_argument("--audit-key", type=Path, help="audit sealing key (created if missing)")
    parser.add_argument("--baseline", type=Path, help=f"runtime baseline (default: {DEFAULT_BASELINE})")
    parser.add_argument("--pids-max", type=int, default=512, help="process limit for the session (default 512)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def _user(spec: str | None) -> tuple[int | None, int | None]:
    if spec is None:
        return None, None
    try:
        entry = pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
    except (KeyError, ValueError):
        raise PlanError(f"--user {spec}: no such user") from None
    return entry.pw_uid, entry.pw_gid


def _refuse(message: str) -> int:
    print(f"adl-exec: refused: {message}", file=sys.stderr)
    return EXIT_REFUSED


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.daemon and not args.explain:
        from .exec_daemon import launch_via_daemon

        return launch_via_daemon(parser, args, command)
    if args.adl is None:
        parser.error("--adl is required (or --daemon with --agent)")
    session_id = sessions.new_session_id()
    policy: Policy | None = None
    try:
        # The egress settings (pydantic-settings) load only when the plan has a network layer; the
        # home region, which residency rules compile against, is the same variable they read.
        options = CompileOptions(
            production=args.production,
            regions=load_regions(args.regions),
            home_region=os.environ.get("ADL_ENFORCER_HOME_REGION") or None,
        )
        policy = load_policy(args.adl, args.aaif, options)
        baseline = load_baseline(args.baseline or Path(os.environ.get("ADL_ENFORCER_BASELINE", DEFAULT_BASELINE)))
        uid, gid = _user(args.user)
        plan = build_plan(
            policy,
            command,
            baseline=baseline,
            environ=dict(os.environ),
            features=sessions.host_features(),
            accept_unenforced=frozenset(args.accept_unenforced),
            pids_max=args.pids_max,
            explain_only=args.explain,
        )
    except (PolicyFileError, DocumentRejected, PlanError, OSError) as exc:
        reason = str(exc)
        if not args.explain:
            _audit_refusal(args, policy, session_id, reason, command)
        return _refuse(reason)
    if args.explain:
        _print_explain(policy, plan, args.json)
        return 0
    for domain in plan.accepted_unenforced:
        print(f"adl-exec: warning: '{domain}' is NOT enforced (accepted with --accept-unenforced)", file=sys.stderr)
    try:
        writer = _open_writer(args)
    except AuditUnavailable as exc:
        return _refuse(f"audit log unavailable, nothing runs unrecorded: {exc}")
    try:
        outcome = sessions.run_session(policy, plan, writer, session_id, uid=uid, gid=gid)
    except LaunchError as exc:
        _safe_refusal(writer, policy, session_id, str(exc), command)
        return _refuse(str(exc))
    except AuditUnavailable as exc:
        return _refuse(f"audit log failed: {exc}")
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


def print_report(report: dict[str, Any], as_json: bool) -> None:
    """--report: the session's typed outcome on stderr (embedded and daemon mode alike)."""
    if as_json:
        print(json.dumps(report), file=sys.stderr)
        return
    extra = f", signal {report['signal']}" if report["signal"] else ""
    if report["creations_refused"]:
        extra += f", {report['creations_refused']} denied name(s) not created"
    print(
        f"adl-exec: {report['session']} ended: {report['reason']} (exit code {report['exit_code']}{extra}, "
        f"{report['duration_ms']} ms)",
        file=sys.stderr,
    )


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


if __name__ == "__main__":
    sys.exit(main())
