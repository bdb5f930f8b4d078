"""The user site-packages, imported as root. Outside a venv, an interpreter started as root puts
$HOME/.local/lib/pythonX.Y/site-packages on sys.path and runs the `import` lines of the .pth files
there at its start. `sudo -E adl-exec --user $USER` keeps the user's HOME: the agent, running as
that user, may write there and have its code run as root at the next launch (and lazily imported
modules found there first, by the egress filter as a session starts). The directory, or the nearest
one above it that exists, is held to PYTHONPATH's rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers.sandbox import AGENT_GID, AGENT_UID, needs_root

pytestmark = needs_root

REPO = Path(__file__).resolve().parents[2]
# The interpreter the venv was made from: the one an install outside a venv would run.
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
CHECK = "from enforcer.cli.python_path import refuse_untrusted; refuse_untrusted('adl-exec'); print('ran')"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def run_check(home: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The refusal as adl-exec makes it, in the base interpreter started as root with HOME=home
    (the repository imported from the working directory: `-c` puts it first on sys.path)."""
    if not BASE_PYTHON.exists():
        pytest.skip(f"no base interpreter at {BASE_PYTHON}")
    return subprocess.run(
        [str(BASE_PYTHON), *flags, "-c", CHECK],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def own(path: Path) -> None:
    for part in (path, *path.rglob("*")):
        os.chown(part, AGENT_UID, AGENT_GID)


def test_a_user_site_the_agent_may_write_is_refused(tmp_path: Path) -> None:
    markers = tmp_path / "markers"  # only root may write here
    markers.mkdir(mode=0o755)
    home = tmp_path / "home"
    site_packages = home / ".local" / "lib" / VERSION / "site-packages"
    site_packages.mkdir(parents=True)
    marker = markers / "ran"
    (site_packages / "planted.pth").write_text(f"import os; open({str(marker)!r}, 'w').write(str(os.getuid()))\n")
    own(home)  # the user's HOME, where the agent (that user) wrote
    run = run_check(home)
    if not marker.exists():
        pytest.skip(f"{BASE_PYTHON} imports no user site-packages: {run.stderr}")
    # The control: the interpreter ran the agent's .pth as root before any of the command's code.
    assert marker.read_text() == "0"
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout, run.stderr)
    assert f"names '{site_packages}'" in run.stderr and "owned by uid" in run.stderr, run.stderr


def test_a_home_where_the_agent_could_create_a_user_site_is_refused(tmp_path: Path) -> None:
    """No user site-packages yet: whoever may write the nearest directory above it may create it
    before the next start."""
    home = tmp_path / "home"
    home.mkdir()
    own(home)
    run = run_check(home)
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout, run.stderr)
    assert f"names '{home}'" in run.stderr, run.stderr
    # Without a user site-packages (-s) nothing is imported from HOME: nothing to refuse.
    alone = run_check(home, "-s")
    assert alone.returncode == 0 and alone.stdout == "ran\n", alone.stderr
    private = tmp_path / "root-home"
    private.mkdir(mode=0o700)
    control = run_check(private)
    assert control.returncode == 0 and control.stdout == "ran\n", control.stderr
