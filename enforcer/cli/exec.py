"""adl-exec: run a command as an agent under kernel-enforced ADL permissions.

This module stays light: a well-formed `--daemon` launch is read without argparse
(enforcer/cli/daemon_args.py) and imports only its client; an embedded launch forks its stage and
guardian (enforcer/sandbox/stage.py) before the policy code is imported, so the launch path never
forks a process of tens of megabytes.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def epilog() -> str:
    from ..sandbox import DOMAINS
    from .exec_common import EXIT_REFUSED

    return f"""\
Every layer is enforced by the kernel: Landlock (files, executables), a private mount namespace
(denied files masked), an empty network namespace, its own PID and IPC namespaces and /proc, seccomp,
cgroups (memory, CPU, pids, wall clock), no capabilities, never host root (--user, else the sudo
caller; the workspace must be usable by that user). A layer that cannot be enforced makes adl-exec
refuse, unless you accept it with --accept-unenforced DOMAIN ({", ".join(DOMAINS)}); the
acceptance is printed and audited.

Kernel denials (Landlock, seccomp) are read from the kernel's audit subsystem and recorded in the
audit log. When kernel auditing is off on the host, adl-exec TURNS IT ON for the whole host (and
leaves it on: other sessions may be reading), says so on stderr and records it; --explain tells
beforehand. Where it cannot be used, the session runs and "kernel denials: unavailable (why)" is
printed. ADL_ENFORCER_KERNEL_AUDIT=off: neither read nor turned on.

examples:
  adl-exec --adl policies/examples/coding-agent.adl.json --explain -- python3 agent.py
  adl-exec --adl policies/examples/coding-agent.adl.json --user nobody --report -- cat /tmp/adl-demo/workspace/notes.txt
  adl-exec --adl agent.adl.json --aaif agent.aaif.json --user nobody -- node agent.js
  adl-exec --learn learned.adl.json --adl start.adl.json -- python3 agent.py
  adl-exec --daemon unix:/run/adl-enforcer/launch.sock --agent "Coding Agent" -- python3 agent.py

Validated, compiled documents are cached (ADL_ENFORCER_CACHE_DIR, 'off' to disable; see docs/adl-exec.md).
Many short commands: launch them with --daemon (the daemon holds the compiled policy; docs/adl-exec.md).

exit codes: the command's own exit code; 128+N when it was killed by signal N (timeouts and OOM
kills included, see --report); {EXIT_REFUSED} when adl-exec refused or could not set up the sandbox.
"""


def build_parser() -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    from .. import data
    from ..sandbox import DOMAINS
    from ..version import version_action
    from .daemon_args import DEFAULT_PIDS_MAX

    parser = argparse.ArgumentParser(
        prog="adl-exec",
        usage="adl-exec --adl FILE [options] -- COMMAND [ARGS...]",
        description="Launch a command as an agent under the permissions its ADL (and AAIF) documents declare.",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=version_action("adl-exec"))
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
    parser.add_argument("--regions", type=Path, help=f"region map (default: {data.REGIONS})")
    parser.add_argument(
        "--explain", action="store_true", help="print the effective policy and every layer, run nothing"
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the outcome (exit | signal | oom | timeout | pids_limit | refused), a summary of the kernel's "
        "denials (Landlock, seccomp) and where the audit log is, on stderr when the command ends",
    )
    parser.add_argument(
        "--learn",
        type=Path,
        metavar="OUT.adl.json",
        help="LEARN MODE: run once with files observed instead of restricted (loud, audited; refused with "
        "--production or --daemon), then write the smallest policy that would have allowed the run to OUT "
        "and print its diff against --adl",
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
    parser.add_argument(
        "--user",
        metavar="NAME|UID[:GID]",
        help="run the agent as this user (never root; a uid without a passwd entry needs :GID). Default: the "
        "sudo caller (SUDO_UID/SUDO_GID), else adl-exec's own uid; root with neither is refused",
    )
    parser.add_argument(
        "--audit-dir",
        type=Path,
        help="audit log directory (default: $ADL_ENFORCER_AUDIT_DIR, "
        "else /var/log/adl-enforcer for root, ~/.local/state/adl-enforcer/audit otherwise)",
    )
    parser.add_argument("--audit-key", type=Path, help="audit sealing key (created if missing)")
    parser.add_argument("--baseline", type=Path, help=f"runtime baseline (default: {data.RUNTIME_BASELINE})")
    parser.add_argument(
        "--pids-max",
        type=int,
        default=DEFAULT_PIDS_MAX,
        help=f"process limit for the session (default {DEFAULT_PIDS_MAX})",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as the command
        from ..command_start import start_command

        start_command()
        from .python_path import refuse_untrusted

        refuse_untrusted("adl-exec")
        return end_command(_main(sys.argv[1:]))
    return _main(argv)


def end_command(code: int) -> int:
    """Exit with `code` now, skipping the interpreter's teardown (freeing every module and object
    of the launch path), which would only delay the caller hearing of the agent's end. By then the
    launch has closed what it opened (the audit log, the guardian's socket, the stage). Everything
    a normal exit does that can matter is done first: atexit callbacks, then flushing stdout and
    stderr. Returns `code`, for the normal exit, when that cannot be done the same way: a thread
    still runs (a normal exit waits for it), or a flush failed (the normal exit reports it)."""
    threading = sys.modules.get("threading")  # not imported: no thread was started through it
    if threading is not None and any(t is not threading.main_thread() for t in threading.enumerate()):
        return code
    import atexit

    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None when the interpreter started without that descriptor
                stream.flush()
    except (OSError, ValueError):
        return code
    os._exit(code)


def _main(argv: list[str]) -> int:
    from .daemon_args import read

    fast = read(argv, os.environ)
    if fast is not None:
        from .exec_daemon import fast_launch

        code = fast_launch(fast, os.environ)
        if code is not None:
            return code
    from .exec_args import EmbeddedArgs
    from .exec_args import read as read_embedded

    args: EmbeddedArgs | argparse.Namespace | None = read_embedded(argv, os.environ)
    if isinstance(args, EmbeddedArgs):
        command = args.command
    else:
        parser = build_parser()
        args = parser.parse_args(argv)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if args.learn and args.daemon:
            parser.error("--learn runs embedded only (the daemon never runs an agent unrestricted)")
        if args.daemon and not args.explain:
            from .exec_daemon import launch_via_daemon

            return launch_via_daemon(parser, args, command)
        if args.adl is None:
            parser.error("--adl is required (or --daemon with --agent)")
    from ..sandbox.stage import new_session_id, prepare
    from ..settings import launch as launch_settings

    try:
        # The plain settings only: the egress filter's are validated (pydantic) when a plan needs them.
        settings = launch_settings.read(os.environ)
    except launch_settings.SettingsError as exc:
        build_parser().error(str(exc))
    session = new_session_id()
    if not args.explain:
        # What exists now is shared with the stage and the session's init: collections in this
        # process would write to every object they examine, copying those pages. Frozen objects are
        # never examined (nor freed when they become cyclic garbage: the few this process made).
        import gc

        gc.freeze()
    prepared = None
    if not args.explain:
        from ..command_start import lift_limits

        # Before the stage, guardian and init are forked: they are the enforcer's too. The agent
        # gets the caller's limits back (pid 2 sets them before its exec).
        agent_limits, refusal = lift_limits()
        # Now, while this process is small: the stage runs on the other core while the imports below run.
        prepared = prepare(session, cgroup_group=settings.cgroup_group, agent_limits=agent_limits, refusal=refusal)
    try:
        from .exec_embedded import run_embedded

        return run_embedded(args, command, session, prepared, settings)
    finally:
        if prepared is not None:
            prepared.discard()


if __name__ == "__main__":
    sys.exit(main())
