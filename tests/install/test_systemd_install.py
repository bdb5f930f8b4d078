"""`adl-enforcerd install-systemd` into a temporary root (DESTDIR-style): the files it writes, the unit
verified and rated by systemd-analyze as written, the sysusers and tmpfiles files applied below that
root by systemd's own tools, and the host's /etc left alone."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.data import DATA_DIR

pytestmark = pytest.mark.install

EXPOSURE_THRESHOLD = 5.1  # systemd/README.md
ENTRY = Path(sys.prefix) / "bin" / "adl-enforcerd"
HOST_FILES = [
    Path("/etc/systemd/system/adl-enforcerd.service"),
    Path("/etc/sysusers.d/adl-enforcer.conf"),
    Path("/etc/tmpfiles.d/adl-enforcer.conf"),
    Path("/etc/adl-enforcer/enforcer.toml"),
]
needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd tools not installed")


def _host_state() -> list[tuple[str, float | None]]:
    return [(str(p), p.stat().st_mtime if p.exists() else None) for p in HOST_FILES]


def install(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENTRY), "install-systemd", "--root", str(root), *extra], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    before = _host_state()
    target = tmp_path / "root"
    target.mkdir()
    result = install(target)
    assert result.returncode == 0, result.stdout + result.stderr
    yield target
    assert _host_state() == before, "the host's /etc was touched"


def test_files_are_written_below_the_root(root: Path) -> None:
    for host_path in HOST_FILES:
        path = root / host_path.relative_to("/")
        assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o644, path
    unit = (root / "etc/systemd/system/adl-enforcerd.service").read_text()
    packaged = (DATA_DIR / "systemd" / "adl-enforcerd.service").read_text()
    assert re.findall(r"(?m)^ExecStart=.*$", unit) == [f"ExecStart={ENTRY}"]
    assert re.sub(r"(?m)^ExecStart=.*$", "", unit) == re.sub(r"(?m)^ExecStart=.*$", "", packaged)
    assert "Delegate=yes" in unit


def test_sample_configuration_is_valid_and_names_the_installation(root: Path) -> None:
    config = root / "etc/adl-enforcer/enforcer.toml"
    assert (
        str(ENTRY) in config.read_text() and str(DATA_DIR / "policies" / "runtime-baseline.yaml") in config.read_text()
    )
    run = subprocess.run(
        [str(ENTRY), "--config", str(config), "--print-config", "--json"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ADL_ENFORCER_")},
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    settings = json.loads(run.stdout)
    assert settings["policy_dir"] == "/etc/adl-enforcer/policies" and settings["socket_group"] == "adl-enforcer"


def test_an_existing_configuration_is_kept(root: Path) -> None:
    config = root / "etc/adl-enforcer/enforcer.toml"
    config.write_text('policy_dir = "/srv/agents"\n')
    again = install(root)
    assert again.returncode == 0 and "kept" in again.stdout and config.read_text() == 'policy_dir = "/srv/agents"\n'
    forced = install(root, "--force-config")
    assert forced.returncode == 0 and "socket_group" in config.read_text()


def test_a_prefix_without_adl_enforcer_is_refused(tmp_path: Path) -> None:
    result = install(tmp_path / "root", "--prefix", str(tmp_path))
    assert result.returncode == 1 and "not an executable" in result.stderr
    assert not (tmp_path / "root").exists()


@needs_systemd
def test_installed_unit_verifies_and_is_rated(root: Path) -> None:
    unit = root / "etc/systemd/system/adl-enforcerd.service"
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and verify.stdout == verify.stderr == "", verify.stdout + verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True, timeout=120
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout + security.stderr)
    assert found, security.stdout + security.stderr
    print(f"exposure {found.group(1)}")
    assert float(found.group(1)) <= EXPOSURE_THRESHOLD


@needs_systemd
def test_sysusers_and_tmpfiles_apply_below_the_root(root: Path) -> None:
    sysusers = subprocess.run(["systemd-sysusers", f"--root={root}"], capture_output=True, text=True, timeout=60)
    assert sysusers.returncode == 0, sysusers.stderr
    group = next(line for line in (root / "etc/group").read_text().splitlines() if line.startswith("adl-enforcer:"))
    gid = int(group.split(":")[2])
    tmpfiles = subprocess.run(
        ["systemd-tmpfiles", f"--root={root}", "--create", str(root / "etc/tmpfiles.d/adl-enforcer.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tmpfiles.returncode == 0, tmpfiles.stderr
    policies = (root / "etc/adl-enforcer/policies").stat()
    assert stat.S_IMODE(policies.st_mode) == 0o750 and policies.st_gid == gid and policies.st_uid == 0
