"""OpenSSL's configuration planted where root reads it. Every enforcer process imports hashlib
(the audit log's chain, the policy's digests), which initializes OpenSSL, which reads the file
OPENSSL_CONF names, even under `python -I -S`: a `providers` section there with `activate = 1`
has OpenSSL dlopen the `module` it names, so an operator's OPENSSL_CONF naming a file the agent may
write (in its workspace) runs the agent's library as root in the launcher, its init, the egress
filter and the daemon. OPENSSL_MODULES (where a provider named without a slash is looked up),
OPENSSL_ENGINES (the same for engines) and OPENSSL_CONF_INCLUDE (where a relative `.include` is
looked up) name directories with the same effect. Each is held to PYTHONPATH's rules: refused,
naming it, before anything runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers.sandbox import AGENT_GID, AGENT_UID, Sandbox, needs_root

pytestmark = needs_root

# A provider whose loading is seen: its constructor writes the uid it runs as to MARKER.
PROVIDER = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fprintf(f, "%d\n", (int)getuid()); fclose(f); }
}
int OSSL_provider_init(void) { return 0; }
"""


def plant_provider(workspace: Path, marker: Path) -> Path:
    """The agent's library and the configuration activating it, in its workspace and owned by its
    uid, as if it had written them; returns the configuration. The test builds the library (the
    agent could as well, or bring it)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the planted provider")
    source = workspace / "provider.c"
    source.write_text(PROVIDER)
    library = workspace / "provider.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    config = workspace / "openssl.cnf"
    config.write_text(
        "openssl_conf = init\n[init]\nproviders = providers\n"
        "[providers]\nplanted = planted\n"
        f"[planted]\nmodule = {library}\nactivate = 1\n"
    )
    for path in (source, library, config):
        os.chown(path, AGENT_UID, AGENT_GID)
    return config


def test_an_openssl_config_the_agent_may_write_is_refused_before_it_is_read(sandbox: Sandbox, tmp_path: Path) -> None:
    markers = tmp_path / "markers"  # only root may write here: the agent cannot fake the marker
    markers.mkdir(mode=0o755)
    marker = markers / "loaded"
    config = plant_provider(sandbox.ws, marker)
    control = subprocess.run(
        ["python3", "-I", "-S", "-c", "import hashlib"],
        env={"OPENSSL_CONF": str(config), "PATH": os.environ["PATH"]},
        capture_output=True,
        timeout=60,
    )
    # The control: the planted configuration does load the library as root on this host.
    assert control.returncode == 0 and marker.read_text() == "0\n", control.stderr
    marker.unlink()
    ran = sandbox.python("print('ran')", env={"OPENSSL_CONF": str(config)})
    assert not marker.exists(), f"the agent's library was loaded as uid {marker.read_text().strip()}"
    assert ran.code == 2 and ran.out == "" and ran.records == [], (ran.code, ran.out, ran.err)
    assert f"OPENSSL_CONF names '{config}'" in ran.err, ran.err


def test_openssl_directories_others_may_write_are_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    for name, value in (
        ("OPENSSL_CONF", "openssl.cnf"),  # relative: read from whatever directory a process is in
        ("OPENSSL_MODULES", str(sandbox.ws)),
        ("OPENSSL_ENGINES", str(sandbox.ws)),
        ("OPENSSL_CONF_INCLUDE", str(sandbox.ws)),
        ("OPENSSL_MODULES", "ossl-modules"),
    ):
        ran = sandbox.python("print('ran')", env={name: value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (name, value, ran.code, ran.out, ran.err)
        assert f"{name} names " in ran.err, ran.err
    trusted = tmp_path / "ssl"
    trusted.mkdir(mode=0o755)
    config = trusted / "openssl.cnf"
    config.write_text("# nothing to load\n")
    config.chmod(0o644)
    control = sandbox.python(
        "print('ran')",
        env={
            "OPENSSL_CONF": str(config),
            "OPENSSL_MODULES": str(trusted),
            "OPENSSL_ENGINES": str(trusted),
            "OPENSSL_CONF_INCLUDE": str(trusted),
        },
    )
    assert control.code == 0 and control.out.strip() == "ran", control.err


def test_the_daemon_refuses_an_openssl_config_others_may_write(tmp_path: Path) -> None:
    """adl-enforcerd holds OPENSSL_CONF to the same rule, at its start. As the command (its console
    script runs enforcerd_command), before the daemon's modules import hashlib: the planted provider
    is never loaded. As `python -m enforcer.cli.enforcerd` the refusal comes after those imports."""
    markers = tmp_path / "markers"
    markers.mkdir(mode=0o755)
    marker = markers / "loaded"
    planted = tmp_path / "agent"
    planted.mkdir(mode=0o755)
    config = plant_provider(planted, marker)
    os.chown(planted, AGENT_UID, AGENT_GID)
    for module in ("enforcer.cli.enforcerd_command", "enforcer.cli.enforcerd"):
        run = subprocess.run(
            [sys.executable, "-m", module, "--print-config"],
            env={**os.environ, "OPENSSL_CONF": str(config)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2 and run.stdout == "", (module, run.returncode, run.stdout, run.stderr)
        assert f"adl-enforcerd: OPENSSL_CONF names '{config}'" in run.stderr, run.stderr
        if module == "enforcer.cli.enforcerd_command":
            assert not marker.exists(), f"the planted provider was loaded as uid {marker.read_text().strip()}"
    # The control: the daemon's module itself imports hashlib, and OpenSSL reads the file, first.
    assert marker.read_text() == "0\n"
