"""adl-enforcerd: the enforcement daemon (gRPC decision API, launches, audit log)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import tomli_w

from ..daemon import affinity, spawner
from ..daemon.config import DEFAULT_CONFIG_FILE, ConfigError, Settings, as_plain, load_settings

EPILOG = f"""\
configuration, later sources winning: built-in defaults, the TOML file ({DEFAULT_CONFIG_FILE},
or --config, or $ADL_ENFORCER_CONFIG), then ADL_ENFORCER_<SETTING> environment variables, e.g.
ADL_ENFORCER_POLICY_DIR, ADL_ENFORCER_SOCKET, ADL_ENFORCER_AUDIT_DIR. See --print-config.

sockets:
  API     (socket, mode 0660, socket_group)     Check, CheckBatch, Explain, WaitApproval, Status
  admin   (admin_socket, mode 0600)             the above plus Approve, Reject, ListPending,
                                                ReloadPolicies, ListSessions, TerminateSession
  launch  (launch_socket, mode 0660)            adl-exec --daemon unix:PATH
  every gRPC socket also serves grpc.health.v1 and server reflection.
  the API socket knows each caller's uid (SO_PEERCRED): who may launch an agent or Check as it
  without a session is agent_callers (default: root only); a session token works only for its uid.

signals: SIGHUP reloads the policy directory (a document that fails keeps its previous version);
SIGTERM stops: sessions are ended and their exits recorded first.

examples:
  adl-enforcerd --print-config
  ADL_ENFORCER_POLICY_DIR=policies/examples adl-enforcerd
  systemctl reload adl-enforcerd
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adl-enforcerd",
        description="Serve decisions for agents' declared permissions, launch sessions, and audit everything.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help=f"TOML configuration file (default {DEFAULT_CONFIG_FILE})")
    parser.add_argument("--print-config", action="store_true", help="print the effective configuration and exit")
    parser.add_argument("--json", action="store_true", help="--print-config as JSON instead of TOML")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _spawner_config(settings: Settings) -> dict[str, object]:
    return {
        "audit_dir": str(settings.audit_dir),
        "audit_key": str(settings.audit_key),
        "audit_group_ms": settings.audit_group_ms,
        "audit_group_records": settings.audit_group_records,
        "production": settings.production,
        "regions": str(settings.regions),
        "baseline": str(settings.baseline),
        "cgroup_group": settings.cgroup_group,
        "helper_memory_mb": settings.helper_memory_mb,
        "egress": settings.egress_config(),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"adl-enforcerd: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        plain = as_plain(settings)
        print(json.dumps(plain, indent=2) if args.json else tomli_w.dumps(plain), end="\n" if args.json else "")
        return 0
    logging.basicConfig(level=args.log_level, format="adl-enforcerd: %(levelname)s %(message)s", stream=sys.stderr)
    # The spawner is forked first, while this process has no threads and no gRPC.
    handle = spawner.start(_spawner_config(settings))
    from ..daemon.daemon import StartupError, serve

    try:
        cpus = affinity.pin_this_process(settings.api_cpus)
    except (ValueError, OSError) as exc:
        print(f"adl-enforcerd: cannot start: {exc}", file=sys.stderr)
        return 1
    if cpus is not None:
        logging.getLogger("adl-enforcerd").info("API process on CPU %s", ",".join(map(str, sorted(cpus))))
    try:
        return serve(settings, handle)
    except StartupError as exc:
        print(f"adl-enforcerd: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
