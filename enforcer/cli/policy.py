"""adl-policy: validate, explain, check, sign and keygen for ADL/AAIF documents."""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import data
from ..documents import (
    PolicyFileError,
    compile_documents,
    load_policy,
    load_regions,
    read_document,
    schema_set,
)
from ..explain import explained, render_policy
from ..policy import (
    CompileOptions,
    DocumentRejected,
    EnvVar,
    FileAccess,
    NetworkConnect,
    ProcessExec,
    ToolCall,
    decide,
)
from ..policy.aaif import PROVIDED_CAPABILITIES, capability_findings, condition_findings, validate_aaif
from ..policy.adl import validate_adl
from ..policy.formats import parse_timestamp
from ..policy.loader import detect_kind
from ..settings import launch as launch_settings
from ..text import printable
from ..version import version_text

EXIT_OK, EXIT_DENY, EXIT_USAGE, EXIT_ASK = 0, 1, 2, 3

EPILOG = """\
examples:
  adl-policy validate policies/examples/*.json
  adl-policy explain policies/examples/research-agent.adl.json
  adl-policy check policies/examples/research-agent.adl.json --connect api.example.com:443 --protocol https
  adl-policy check policies/examples/invoice-processor.adl.json --aaif policies/examples/invoice-processor.aaif.json \\
      --tool approve_invoice --args '{"invoice_id": "INV-1"}'

exit codes: validate 0 all valid, 1 any invalid, 2 usage or I/O error;
            check 0 ALLOW, 1 DENY, 3 ASK, 2 usage, I/O or invalid document.
"""


def _now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    parsed = parse_timestamp(value)
    if parsed is None:
        raise argparse.ArgumentTypeError(f"--now {value!r} is not an ISO 8601 timestamp with timezone")
    return parsed


def _capabilities(args: argparse.Namespace) -> frozenset[str]:
    return PROVIDED_CAPABILITIES | frozenset(args.runtime_capability or ())


def _options(args: argparse.Namespace) -> CompileOptions:
    return CompileOptions(
        runtime_capabilities=tuple(sorted(set(args.runtime_capability or ()))),
        production=args.production,
        require_signature=not args.no_require_signature,
        home_region=args.home_region,
        regions=load_regions(args.regions),
        public_test_ranges=tuple(args.public_test_range or ()),
    )


def cmd_validate(args: argparse.Namespace) -> int:
    now = _now(args.now)
    results: dict[str, Any] = {}
    worst = EXIT_OK
    schemas = schema_set(args.spec_dir)
    for name in args.files:
        try:
            document = read_document(name)
        except PolicyFileError as exc:
            findings = exc.findings
            io_error = any(f.code == "ENF-1004" for f in findings)
            worst = max(worst, EXIT_USAGE if io_error else EXIT_DENY)
            results[name] = findings
            continue
        kind = detect_kind(document)
        if kind == "aaif":
            findings = validate_aaif(document, schemas)
            # Validity is the schema's business; a condition this enforcer cannot evaluate, or a
            # required capability it lacks, makes the document refused at compile time (explain,
            # check, adl-exec) at strict and regulated, shown here as a warning.
            findings += [
                replace(
                    f,
                    severity="warning",
                    detail=f.detail + "; refused when compiled" if f.severity == "error" else f.detail,
                )
                for f in (*condition_findings(document), *capability_findings(document, _capabilities(args)))
            ]
        else:
            # Not AAIF, so read as ADL: a missing adl_spec is ADL-1003 with every other finding.
            findings, _sig = validate_adl(document, schemas, now)
        if any(f.severity == "error" for f in findings):
            worst = max(worst, EXIT_DENY)
        results[name] = findings
    for name, findings in results.items():
        errors = [f for f in findings if f.severity == "error"]
        if args.json:
            print(
                json.dumps(
                    {
                        "file": name,
                        "valid": not errors,
                        "errors": [f.to_json() for f in errors],
                        "warnings": [f.to_json() for f in findings if f.severity != "error"],
                    }
                )
            )
            continue
        print(printable(f"{name}: {'invalid' if errors else 'valid'}"))
        for f in findings:
            tag = "error" if f.severity == "error" else "warning"
            print(printable(f"  {tag} {f.code} {f.title} at {f.pointer or '/'}: {f.detail}"))
    return worst


def cmd_explain(args: argparse.Namespace) -> int:
    adl = read_document(args.file, "adl")
    aaif = read_document(args.aaif, "aaif") if args.aaif else None
    policy = compile_documents(adl, aaif, _options(args), _now(args.now), args.spec_dir)
    from ..sandbox import runtime_presets  # only documents that ask for presets need the catalog

    grants = runtime_presets.explain_lines(adl, args.presets)
    if args.json:
        print(json.dumps(explained(policy, grants), indent=2))
    else:
        print(render_policy(policy, grants))
    return EXIT_OK


def _action(args: argparse.Namespace) -> Any:
    chosen = [a for a in ("tool", "connect", "read", "write", "exec", "env") if getattr(args, a) is not None]
    if len(chosen) != 1:
        raise argparse.ArgumentTypeError("give exactly one of --tool, --connect, --read, --write, --exec, --env")
    if args.tool is not None:
        try:
            arguments = json.loads(args.args) if args.args is not None else {}
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"--args is not JSON: {exc.msg}") from exc
        return ToolCall(args.tool, arguments)
    if args.connect is not None:
        host, sep, port = args.connect.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise argparse.ArgumentTypeError("--connect takes HOST:PORT (IPv6: [::1]:443)")
        return NetworkConnect(host.strip("[]"), int(port), args.protocol, args.address)
    if args.read is not None:
        return FileAccess(args.read, "read")
    if args.write is not None:
        return FileAccess(args.write, "write")
    if args.exec is not None:
        argv = tuple(shlex.split(args.exec))
        if not argv:
            raise argparse.ArgumentTypeError("--exec needs a command")
        return ProcessExec(argv)
    return EnvVar(args.env)


def cmd_check(args: argparse.Namespace) -> int:
    action = _action(args)
    policy = load_policy(args.file, args.aaif, _options(args), _now(args.now), args.spec_dir)
    decision = decide(policy, action)
    if args.json:
        print(json.dumps({**decision.to_json(), "warnings": [w.to_json() for w in policy.warnings]}))
    else:
        print(decision.verdict)
        for reason in decision.reasons:
            print(printable(f"  {reason.rule} ({reason.document} {reason.pointer or '/'}): {reason.text}"))
        for key, value in decision.obligations.items():
            print(f"  obligation {key}: {json.dumps(value)}")
        for w in policy.warnings:
            print(printable(f"  warning {w.code} {w.title} at {w.pointer or '/'}: {w.detail}"))
    return {"ALLOW": EXIT_OK, "DENY": EXIT_DENY, "ASK": EXIT_ASK}[decision.verdict]


def cmd_keygen(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    out = Path(args.out)
    if out.exists() and not args.force:
        print(f"adl-policy: {out} exists; use --force to replace it", file=sys.stderr)
        return EXIT_USAGE
    out.write_bytes(pem)
    out.chmod(0o600)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    print(f"wrote {out} (Ed25519 private key, mode 0600); public key: {base64.b64encode(raw).decode()}")
    return EXIT_OK


def cmd_sign(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..policy.errors import pointer
    from ..policy.jsonvalues import unsafe_integers
    from ..policy.signature import sign_ed25519

    key = serialization.load_pem_private_key(Path(args.key).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        print("adl-policy: only Ed25519 keys can sign", file=sys.stderr)
        return EXIT_USAGE
    document = read_document(args.file, "adl")
    unsafe = unsafe_integers(document)
    if unsafe:
        where = ", ".join(pointer(*path) for path in unsafe[:5])
        print(
            f"adl-policy: ENF-1007 integers outside ±(2^53-1) cannot be signed (RFC 8785) at {where}", file=sys.stderr
        )
        return EXIT_USAGE
    signed = sign_ed25519(document, key)
    text = json.dumps(signed, indent=2, ensure_ascii=False) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"signed {args.file} -> {args.out}")
    return EXIT_OK


def _compile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--aaif", metavar="FILE", help="AAIF (SC-006) document for the same agent")
    p.add_argument("--regions", metavar="FILE", help="region map (default: the packaged one, see adl-policy examples)")
    p.add_argument("--home-region", metavar="REGION", help="region that ADL cross_border_restricted keeps data in")
    p.add_argument("--production", action="store_true", help="refuse lifecycle 'draft' agents")
    p.add_argument(
        "--no-require-signature",
        action="store_true",
        help="accept confidential/restricted documents without a verified signature",
    )
    p.add_argument(
        "--public-test-range",
        action="append",
        metavar="CIDR",
        help="treat this documentation range as public (tests only)",
    )
    p.add_argument("--now", metavar="TIMESTAMP", help="evaluate expiry and sunset dates at this time")
    _capability_flag(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _capability_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime-capability",
        action="append",
        metavar="CAP",
        help="an AAIF required_capabilities entry the agent's runtime provides (repeatable); this "
        f"enforcer provides {', '.join(sorted(PROVIDED_CAPABILITIES))}",
    )


def cmd_examples(args: argparse.Namespace) -> int:
    for path in sorted(data.EXAMPLES.glob("*.json")):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adl-policy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description="Validate ADL/AAIF documents, show the effective policy, and ask what it allows.",
    )
    parser.add_argument("--version", action="version", version=version_text("adl-policy"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("examples", help="print the paths of the example documents shipped with the package")
    p.set_defaults(func=cmd_examples)
    p = sub.add_parser("validate", help="validate documents (ADL 0.1-0.3, AAIF SC-006)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="one JSON object per file, in the ADL error format")
    p.add_argument("--now", metavar="TIMESTAMP", help="evaluate expiry and sunset dates at this time")
    _capability_flag(p)
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser(
        "explain", help="print the effective policy, what the runtime presets it enables grant, and its warnings"
    )
    p.add_argument("file", metavar="ADL_FILE")
    _compile_flags(p)
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser(
        "check",
        help="decide one action against the policy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    p.add_argument("file", metavar="ADL_FILE")
    _compile_flags(p)
    p.add_argument("--tool", metavar="NAME", help="a tool call")
    p.add_argument("--args", metavar="JSON", help="tool arguments as a JSON object (default {})")
    p.add_argument("--connect", metavar="HOST:PORT", help="a network connection")
    p.add_argument(
        "--protocol",
        default="tcp",
        help="protocol of --connect (tcp, http, https, wss, ssh, ...; default tcp); it must be one that "
        "allowed_protocols declares (a declared tcp covers what TCP carries)",
    )
    p.add_argument("--address", metavar="IP", help="the address --connect would reach (checks deny_private)")
    p.add_argument("--read", metavar="PATH", help="a file read")
    p.add_argument("--write", metavar="PATH", help="a file write")
    p.add_argument("--exec", metavar="COMMAND", help="a process execution (shell-quoted command line)")
    p.add_argument("--env", metavar="NAME", help="an environment variable")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("keygen", help="create an Ed25519 signing key")
    p.add_argument("out", metavar="KEY_FILE")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_keygen)
    p = sub.add_parser("sign", help="sign an ADL document (JCS + Ed25519), writing a signed copy")
    p.add_argument("file", metavar="ADL_FILE")
    p.add_argument("--key", required=True, metavar="KEY_FILE")
    p.add_argument("--out", default="-", metavar="FILE", help="output file (default: standard output)")
    p.set_defaults(func=cmd_sign)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = launch_settings.read(os.environ)
        args.spec_dir, args.presets = settings.spec_dir, settings.presets
    except launch_settings.SettingsError as exc:
        parser.error(str(exc))
    try:
        return int(args.func(args))
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    except DocumentRejected as exc:
        if getattr(args, "json", False):
            print(json.dumps(exc.to_json()))
        else:
            print(printable(f"adl-policy: document rejected: {exc}"), file=sys.stderr)
            for f in exc.findings:
                if f.severity == "error":
                    print(printable(f"  {f.code} {f.title} at {f.pointer or '/'}: {f.detail}"), file=sys.stderr)
        return EXIT_USAGE
    except (PolicyFileError, OSError) as exc:
        findings = getattr(exc, "findings", None) or []
        if findings and getattr(args, "json", False):
            print(json.dumps({"errors": [f.to_json() for f in findings]}))
        print(printable(f"adl-policy: {exc}"), file=sys.stderr)
        for f in findings:
            print(printable(f"  {f.code} {f.title} at {f.pointer or '/'}: {f.detail}"), file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
