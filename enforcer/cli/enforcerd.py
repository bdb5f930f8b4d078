"""adl-enforcerd: the enforcement daemon (gRPC decision API, launches, audit log)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import tomli_w

from .. import paths
from ..command_start import start_command
from ..daemon import affinity, notify, spawner
from ..daemon.config import DEFAULT_CONFIG_FILE, ConfigError, Settings, as_plain, load_settings
from ..daemon.instance import InstanceLock, InstanceLocked, lock_paths
from ..daemon.orders import SpawnerConfig
from ..version import version_text

EPILOG = f"""\
configuration, later sources winning: built-in defaults, the TOML file ({DEFAULT_CONFIG_FILE},
or --config, or $ADL_ENFORCER_CONFIG), then ADL_ENFORCER_<SETTING> environment variables, e.g.
ADL_ENFORCER_POLICY_DIR, ADL_ENFORCER_SOCKET, ADL_ENFORCER_AUDIT_DIR. See --print-config; every
setting, its default and meaning: docs/settings.md.

sockets:
  API     (socket, mode 0660, socket_group)     Check, CheckBatch, Explain, WaitApproval, Status
  admin   (admin_socket, mode 0600)             the above plus Approve, Reject, ListPending,
                                                ReloadPolicies, ListSessions, TerminateSession
  launch  (launch_socket, mode 0660)            adl-exec --daemon unix:PATH
  every gRPC socket also serves grpc.health.v1 and server reflection.
  the API socket knows each caller's uid (SO_PEERCRED): who may launch an agent or Check as it
  without a session is agent_callers (default: root only); a session token works only for its uid.
  each uid but root may add check_audit_bytes_per_uid of decision records per audit_budget_window_s;
  beyond, its Checks get RESOURCE_EXHAUSTED undecided, counted in a summary record.

policy_dir, every directory above it and its documents must be writable only by root or the
daemon's user: otherwise it refuses to start, naming the path and what is wrong.

signals: SIGHUP reloads the policy directory (a document that fails keeps its previous version;
an empty, unreadable or unsafe directory keeps every agent loaded before); SIGTERM stops: sessions
are ended and their exits recorded first.

one daemon per socket and per cgroup_group: each holds a lock file beside its sockets
(api.sock.lock, ...) and cgroup-<cgroup_group>.lock in the runtime directory; a second one on
the same configuration refuses to start (exit 1) and names the holder's pid.

health (grpc.health.v1, Status.serving, the systemd watchdog ping) turns NOT_SERVING while the
audit log cannot be written or a write has not returned within audit_write_deadline_s.

install as a service (unit, sysusers, tmpfiles, sample configuration; see install-systemd --help):
  adl-enforcerd install-systemd [--prefix VENV] [--root DIR]

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
    parser.add_argument("--version", action="version", version=version_text("adl-enforcerd"))
    parser.add_argument("--print-config", action="store_true", help="print the effective configuration and exit")
    parser.add_argument("--json", action="store_true", help="--print-config as JSON instead of TOML")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _spawner_config(settings: Settings) -> SpawnerConfig:
    return SpawnerConfig(
        audit_dir=settings.audit_dir,
        audit_key=settings.audit_key,
        audit_group_ms=settings.audit_group_ms,
        audit_group_records=settings.audit_group_records,
        production=settings.production,
        regions=settings.regions,
        baseline=settings.baseline,
        cgroup_group=settings.cgroup_group,
        helper_memory_mb=settings.helper_memory_mb,
        prepared_sessions=settings.prepared_sessions,
        egress=settings.egress(),
        presets=settings.presets,
        spec_dir=settings.spec_dir,
        kernel_audit=settings.kernel_audit,
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as the command
        start_command()
        from .python_path import refuse_untrusted

        refuse_untrusted("adl-enforcerd")
        argv = sys.argv[1:]
    if argv[:1] == ["install-systemd"]:
        from . import install_systemd

        return install_systemd.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config, os.environ)
    except ConfigError as exc:
        print(f"adl-enforcerd: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        plain = as_plain(settings)
        print(json.dumps(plain, indent=2) if args.json else tomli_w.dumps(plain), end="\n" if args.json else "")
        return 0
    logging.basicConfig(level=args.log_level, format="adl-enforcerd: %(levelname)s %(message)s", stream=sys.stderr)
    # Taken first, before anything touches sockets, sessions, cgroups or the audit log: a second
    # daemon must not even fork a spawner, whose guardian would sweep the first one's sessions (the
    # same cgroup group) when this process exits.
    sockets = [settings.socket, settings.admin_socket, settings.launch_socket]
    instance = InstanceLock(lock_paths(sockets, paths.runtime_dir(os.environ), settings.cgroup_group))
    try:
        instance.acquire()
    except (InstanceLocked, OSError) as exc:
        print(f"adl-enforcerd: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        _place_in_cgroup_leaf(settings.cgroup_group)
        # The spawner is forked while this process has no threads and no gRPC. It closes its copies
        # of the locks at once: its supervisors may outlive this process by a moment.
        handle = spawner.start(_spawner_config(settings), close=instance.descriptors())
        return _serve(settings, handle)
    finally:
        instance.release()


def _place_in_cgroup_leaf(group: str) -> None:
    """cgroup v2 with delegation: this process into a leaf, the sessions' groups beside it (see
    cgroups.place_in_leaf). Before the spawner is forked, so that it starts in the leaf too."""
    from ..sandbox import cgroups

    log = logging.getLogger("adl-enforcerd")
    try:
        placed = cgroups.place_in_leaf(group=group)
    except OSError as exc:
        log.error("cgroup v2: %s; launches whose policy sets resource limits will be refused", exc)
        return
    if placed is not None:
        log.info(
            "cgroup v2, delegated: daemon in %s, sessions below %s with %s",
            placed.leaf,
            placed.base / group,
            ", ".join(placed.controllers) or "no controller",
        )
    elif cgroups.detect() == "v2":
        log.warning(
            "cgroup v2: this daemon's cgroup is not delegated to it (systemd: Delegate=yes), so it stays "
            "there: launches whose policy sets resource limits are refused unless the session groups below "
            "it get their controllers"
        )


def _serve(settings: Settings, handle: spawner.SpawnerHandle) -> int:
    from ..daemon.daemon import StartupError, serve

    try:
        cpus = affinity.pin_this_process(settings.api_cpus)
    except (ValueError, OSError) as exc:
        print(f"adl-enforcerd: cannot start: {exc}", file=sys.stderr)
        return 1
    if cpus is not None:
        logging.getLogger("adl-enforcerd").info("API process on CPU %s", ",".join(map(str, sorted(cpus))))
    try:
        return serve(settings, handle, notify.Systemd.from_environment(os.environ, os.getpid()))
    except StartupError as exc:
        print(f"adl-enforcerd: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
