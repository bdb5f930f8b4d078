"""adl-enforcerd install-systemd: install the unit, sysusers and tmpfiles files and a sample configuration
for the adl-enforcerd of one virtual environment (default: the one this command runs from).

Everything is written below --root (default /), so a package build or a test can install into an
empty directory (DESTDIR-style) without touching the host's /etc.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import data
from ..sandbox import cgroups

UNIT_NAME = "adl-enforcerd.service"
CONFIG = Path("/etc/adl-enforcer/enforcer.toml")
DESTINATIONS = {
    UNIT_NAME: Path("/etc/systemd/system") / UNIT_NAME,
    "adl-enforcer.conf": Path("/etc/sysusers.d/adl-enforcer.conf"),
    "adl-enforcer-tmpfiles.conf": Path("/etc/tmpfiles.d/adl-enforcer.conf"),
}

SAMPLE_CONFIG = """\
# adl-enforcerd configuration (TOML). Later sources win: built-in defaults, this file, then
# ADL_ENFORCER_<SETTING> environment variables. `{exe} --print-config` shows every setting.
# Written by `adl-enforcerd install-systemd` for the installation in {prefix}.

# ADL/AAIF documents served and launched (reloaded on `systemctl reload adl-enforcerd`).
policy_dir = "/etc/adl-enforcer/policies"
# Members of this group may use the API and launch sockets.
socket_group = "adl-enforcer"
# Refuse documents whose lifecycle status is draft.
production = false
# Who may launch each agent (by key, id, name or "*") and Check as it without a session: "uid:N",
# "user:NAME", "group:NAME". Unset, only root may, and root cannot launch (agents never run as
# host root). For example, every member of the socket group, for every agent:
#   agent_callers = {{ "*" = ["group:adl-enforcer"] }}

# The runtime baseline and region map default to the files shipped in the package:
#   baseline = "{baseline}"
#   regions = "{regions}"
# To change one, copy it to /etc/adl-enforcer/ and name the copy here.
"""


@dataclass(frozen=True)
class Installed:
    written: list[Path]
    kept: list[Path]
    cgroup: str


class InstallError(Exception):
    pass


def render_unit(template: str, executable: Path) -> str:
    """The packaged unit with ExecStart naming this installation's entry point."""
    text, count = re.subn(r"(?m)^ExecStart=\S+", f"ExecStart={executable}", template)
    if count != 1:
        raise InstallError("the packaged unit has no single ExecStart= line")
    return text


def _entry_point(prefix: Path) -> Path:
    executable = prefix / "bin" / "adl-enforcerd"
    if not os.access(executable, os.X_OK):
        raise InstallError(
            f"{executable} is not an executable: is --prefix the virtual environment adl-enforcer is in?"
        )
    return executable


def _package_data(prefix: Path) -> tuple[str, str]:
    """The baseline and region map of the package installed in `prefix` (it may not be this process's)."""
    python = prefix / "bin" / "python"
    probe = "import enforcer.data as d; print(d.RUNTIME_BASELINE); print(d.REGIONS)"
    run = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    lines = run.stdout.split("\n")
    if run.returncode != 0 or len(lines) < 2:
        raise InstallError(f"{python} cannot import adl-enforcer: {run.stderr.strip()[-500:]}")
    return lines[0], lines[1]


def _write(root: Path, target: Path, text: str, mode: int) -> Path:
    path = root / target.relative_to("/")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.chmod(mode)
    temporary.replace(path)
    return path


def install(prefix: Path, root: Path, force_config: bool = False) -> Installed:
    executable = _entry_point(prefix)
    baseline, regions = _package_data(prefix)
    written: list[Path] = []
    kept: list[Path] = []
    for name, target in DESTINATIONS.items():
        text = (data.DATA_DIR / "systemd" / name).read_text()
        if name == UNIT_NAME:
            text = render_unit(text, executable)
        written.append(_write(root, target, text, 0o644))
    config = root / CONFIG.relative_to("/")
    if config.exists() and not force_config:
        kept.append(config)
    else:
        sample = SAMPLE_CONFIG.format(exe=executable, prefix=prefix, baseline=baseline, regions=regions)
        written.append(_write(root, CONFIG, sample, 0o644))
    return Installed(written, kept, cgroups.detect() if root == Path("/") else "not checked")


NEXT_STEPS = """\
next:
  systemd-sysusers /etc/sysusers.d/adl-enforcer.conf
  systemd-tmpfiles --create /etc/tmpfiles.d/adl-enforcer.conf
  systemctl daemon-reload && systemctl enable --now adl-enforcerd
  systemctl reload adl-enforcerd     # after changing /etc/adl-enforcer/policies"""

CGROUP_NOTES = {
    "v1": "cgroup v1 controllers: sessions get memory, cpu and pids cgroups below the unit's (Delegate=yes).",
    "v2": "cgroup v2: at start the daemon moves itself into daemon/ in its delegated cgroup (Delegate=yes) "
    "and creates the session cgroups beside it with memory, cpu and pids. Its log at start names them, or "
    "says why not: then launches whose policy sets resource limits are refused (docs/install.md, cgroups).",
    "none": "no usable cgroup hierarchy (memory, cpu, pids) on this host: sessions will be refused.",
    "not checked": "cgroups: not checked (--root is not /); Delegate=yes serves v1 and v2 hosts.",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="adl-enforcerd install-systemd",
        description="Install adl-enforcerd's systemd unit, sysusers and tmpfiles files and a sample "
        f"{CONFIG} (kept if it exists) for the adl-enforcer installed in --prefix.",
        epilog="example: python3 -m venv /opt/adl-enforcer && /opt/adl-enforcer/bin/pip install adl-enforcer && "
        "/opt/adl-enforcer/bin/adl-enforcerd install-systemd",
    )
    parser.add_argument(
        "--prefix", type=Path, default=Path(sys.prefix), help=f"the virtual environment (default: {sys.prefix})"
    )
    parser.add_argument("--root", type=Path, default=Path("/"), help="install below this directory (default: /)")
    parser.add_argument("--force-config", action="store_true", help=f"replace an existing {CONFIG}")
    args = parser.parse_args(argv)
    try:
        done = install(args.prefix.absolute(), args.root.absolute(), args.force_config)
    except (InstallError, OSError) as exc:
        print(f"adl-enforcerd install-systemd: {exc}", file=sys.stderr)
        return 1
    for path in done.written:
        print(f"wrote {path}")
    for path in done.kept:
        print(f"kept  {path} (exists; --force-config replaces it)")
    print(CGROUP_NOTES[done.cgroup])
    if args.root == Path("/"):
        print(NEXT_STEPS)
    return 0
