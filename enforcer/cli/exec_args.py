"""The command line of a well-formed embedded launch (`adl-exec --adl P [options] -- CMD`), read
without argparse.

Building adl-exec's argparse parser imports argparse, gettext, locale and shutil and adds every
option, each formatted once to check it: a noticeable part of every embedded launch, which needs
none of it. As enforcer/cli/daemon_args.py does for `--daemon`, read() accepts only the plain
spellings of the options an embedded launch takes and DECLINES (returns None) anything else:
--help, --version, --explain, --learn, --daemon and its options, abbreviations, repeated options
(but --accept-unenforced), values argparse could read another way, a value it would refuse, a
missing --adl or command, or $ADL_ENFORCER_ADDR set (--daemon's default). adl-exec then parses the
same command line with argparse, so every message and exit code is argparse's.
tests/unit/test_exec_args.py checks, over generated command lines, that whenever read() accepts,
argparse reads the same values.
"""

from __future__ import annotations

from pathlib import Path

from .daemon_args import DEFAULT_PIDS_MAX, scan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_FLAGS = ("--report", "--json", "--production")
_PATHS = ("--adl", "--aaif", "--regions", "--baseline", "--audit-dir", "--audit-key")
_VALUED = (*_PATHS, "--user", "--pids-max", "--accept-unenforced")


class EmbeddedArgs:
    """What argparse's namespace holds for an embedded launch (the attributes adl-exec reads)."""

    def __init__(
        self,
        paths: dict[str, Path],
        flags: set[str],
        user: str | None,
        pids_max: int,
        accept_unenforced: list[str],
        command: list[str],
    ) -> None:
        self.adl: Path = paths["--adl"]
        self.aaif = paths.get("--aaif")
        self.regions = paths.get("--regions")
        self.baseline = paths.get("--baseline")
        self.audit_dir = paths.get("--audit-dir")
        self.audit_key = paths.get("--audit-key")
        self.report = "--report" in flags
        self.json = "--json" in flags
        self.production = "--production" in flags
        self.user = user
        self.pids_max = pids_max
        self.accept_unenforced = accept_unenforced
        self.command = command  # without the "--" before it
        # What read() declines, as argparse leaves it when absent.
        self.explain = False
        self.learn: Path | None = None
        self.daemon: str | None = None
        self.agent: str | None = None
        self.session_file: Path | None = None


def read(argv: list[str], environ: Mapping[str, str]) -> EmbeddedArgs | None:
    """The embedded launch argv asks for, or None when argparse must read it (see the module's
    docstring). environ: the process environment ($ADL_ENFORCER_ADDR is --daemon's default)."""
    if environ.get("ADL_ENFORCER_ADDR"):
        return None  # a launch through the daemon, unless --explain: argparse decides
    scanned = scan(argv, _FLAGS, _VALUED)
    if scanned is None:
        return None
    values, flags, accept, command = scanned
    if not command or "--adl" not in values:
        return None
    pids_max = DEFAULT_PIDS_MAX
    if "--pids-max" in values:
        try:
            pids_max = int(values["--pids-max"])  # what argparse's type=int calls
        except ValueError:
            return None
    return EmbeddedArgs(
        paths={name: Path(values[name]) for name in _PATHS if name in values},  # argparse's type=Path
        flags=flags,
        user=values.get("--user"),
        pids_max=pids_max,
        accept_unenforced=accept,
        command=command,
    )
