"""The command line of a well-formed `adl-exec --daemon` launch, read without argparse.

A launch through the daemon is the way to run many short commands, so its client must cost little
more than the interpreter's start-up; building adl-exec's argparse parser (and what its help text
imports) is most of a client's own time. read() accepts only the plain spellings of the options that
go with --daemon and DECLINES (returns None) anything else: --help, --version, every other option,
abbreviations, repeated options, values that argparse could read another way, a missing command.
adl-exec then parses the same command line with argparse, so every message and exit code is the
one argparse gives. tests/unit/test_daemon_args.py checks, over generated command lines, that
whenever read() accepts, argparse reads the same values.

No imports: this runs on every adl-exec invocation before anything else.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# enforcer/sandbox/__init__.py's DOMAINS (importing it would cost a package import per launch);
# tests/unit/test_daemon_args.py checks they are the same.
DOMAINS = ("filesystem", "execution", "environment", "network", "resources")
DEFAULT_PIDS_MAX = 512
_UINT32 = (1 << 32) - 1
_FLAGS = ("--report", "--json")
_VALUED = ("--daemon", "--agent", "--session-file", "--accept-unenforced", "--pids-max")
_DIGITS = frozenset("0123456789")


class DaemonLaunch:
    """What `adl-exec --daemon` needs from its command line, as argparse would have read it."""

    def __init__(
        self,
        address: str,
        agent: str,
        command: list[str],
        session_file: str | None,
        report: bool,
        as_json: bool,
        accept_unenforced: list[str],
        pids_max: int,
    ) -> None:
        self.address = address
        self.agent = agent
        self.command = command
        self.session_file = session_file
        self.report = report
        self.as_json = as_json
        self.accept_unenforced = accept_unenforced
        self.pids_max = pids_max


def _plain_path(value: str) -> bool:
    """A path that pathlib.Path prints back unchanged (the messages name --session-file as a Path)."""
    if not value or "\0" in value:
        return False
    parts = value[1:].split("/") if value.startswith("/") else value.split("/")
    return all(part and part != "." for part in parts)


def read(argv: list[str], environ: Mapping[str, str]) -> DaemonLaunch | None:
    """The launch argv asks for, or None when argparse must read it (see the module's docstring).
    environ: the process environment ($ADL_ENFORCER_ADDR is --daemon's default)."""
    scanned = scan(argv, _FLAGS, _VALUED)
    if scanned is None:
        return None
    values, flags, accept, command = scanned
    address = values["--daemon"] if "--daemon" in values else environ.get("ADL_ENFORCER_ADDR")
    agent = values.get("--agent", "")
    session_file = values.get("--session-file")
    pids = values.get("--pids-max", str(DEFAULT_PIDS_MAX))
    if not command or address is None or not address.startswith("unix:") or not agent:
        return None
    if session_file is not None and not _plain_path(session_file):
        return None
    if not 0 < len(pids) <= 10 or not _DIGITS.issuperset(pids) or int(pids) > _UINT32:
        return None
    return DaemonLaunch(
        address=address,
        agent=agent,
        command=command,
        session_file=session_file,
        report="--report" in flags,
        as_json="--json" in flags,
        accept_unenforced=accept,
        pids_max=int(pids),
    )


def scan(
    argv: list[str], flag_names: tuple[str, ...], valued_names: tuple[str, ...]
) -> tuple[dict[str, str], set[str], list[str], list[str]] | None:
    """(values, flags, --accept-unenforced domains, command) of a command line made only of the
    plain spellings of these options, then the command; None for anything argparse could read
    another way: another option, an abbreviation, a repeat (but --accept-unenforced), a value
    starting with "-", an unknown domain, no command."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    accept: list[str] = []
    at = 0
    while True:
        if at >= len(argv):
            return None  # no command
        arg = argv[at]
        if arg == "--":
            command = argv[at + 1 :]
            break
        if not arg.startswith("-"):
            command = argv[at:]  # argparse's REMAINDER: everything from the first positional on
            known = (*flag_names, *valued_names)
            if any(later.startswith("-") and later.partition("=")[0] not in known for later in command):
                return None  # argparse classifies these too: "--=x" or "--a" is an ambiguous option
            break
        name, eq, value = arg.partition("=")
        if name in flag_names:
            if eq or name in flags:
                return None
            flags.add(name)
            at += 1
            continue
        if name not in valued_names or name in values:
            return None  # another option, an abbreviation, a repeat
        if not eq:
            if at + 1 >= len(argv) or argv[at + 1].startswith("-"):
                return None  # argparse may read a value that starts with "-" as an option
            value = argv[at + 1]
            at += 1
        at += 1
        if value.startswith("-"):
            return None  # "--agent=-x" is read as given, "--agent=--" is dropped: left to argparse
        if name == "--accept-unenforced":
            if value not in DOMAINS:
                return None
            accept.append(value)
        else:
            values[name] = value
    return values, flags, accept, command
