"""The wheel, installed into a fresh venv outside the checkout, gives four working commands.

`python -m build` makes the sdist and builds the wheel from it (so the sdist is proved to build too).
The venv lives in a temporary directory with no `shared/` beside it, and every command runs there
with the checkout off the path and ADL_ENFORCER_SPEC_DIR unset. The venv reaches the dependencies
already installed for the tests through a path entry, so no package index is needed; the package
itself comes only from the wheel (`pip install --no-deps`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.install


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("installed")
    assert not (home.parent / "shared").exists() and REPO not in home.parents
    target = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=120)
    site = Path(
        subprocess.run(
            [str(target / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # A plain path entry: the test environment's .pth files (its editable install) are not run.
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = dist.glob("*.whl")
    install = subprocess.run(
        [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return target


def run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADL_ENFORCER_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(list(args), capture_output=True, text=True, cwd=venv.parent, env=env, timeout=120)


def test_sdist_and_wheel_carry_what_the_commands_read(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "enforcer/v1/enforcer_pb2.py",
        "enforcer/v1/enforcer_pb2_grpc.py",
        "enforcer/data/schemas/adl/core-0.1.0.json",
        "enforcer/data/schemas/adl/core-0.3.0.json",
        "enforcer/data/schemas/aaif/agent.schema.json",
        "enforcer/data/policies/runtime-baseline.yaml",
        "enforcer/data/policies/regions.yaml",
        "enforcer/data/parsed.json",
        "enforcer/data/policies/examples/coding-agent.adl.json",
        "enforcer/data/systemd/adl-enforcerd.service",
    ):
        assert name in names, name
    assert not [n for n in names if n.endswith(".pem")], "the example signing key is not package data"
    (sdist,) = dist.glob("*.tar.gz")
    listing = subprocess.run(["tar", "tzf", str(sdist)], capture_output=True, text=True, check=True).stdout
    assert "/proto/enforcer/v1/enforcer.proto" in listing and "0/enforcer/v1/" not in listing


def test_the_package_is_the_installed_one(venv: Path) -> None:
    probe = "import enforcer, enforcer.policy.specs as s; print(enforcer.__file__); print(s.spec_root())"
    result = run(venv, str(venv / "bin" / "python"), "-c", probe)
    assert result.returncode == 0, result.stderr
    module, schemas = map(Path, result.stdout.split())
    assert venv in module.parents and venv in schemas.parents, result.stdout


def test_every_command_reports_its_version(venv: Path) -> None:
    for command in ("adl-policy", "adl-audit", "adl-exec", "adl-enforcerd"):
        result = run(venv, command, "--version")
        assert result.returncode == 0 and result.stdout.strip() == f"{command} 0.1.0", (command, result)


def test_adl_policy_validates_and_checks_the_shipped_examples(venv: Path) -> None:
    listed = run(venv, "adl-policy", "examples")
    examples = listed.stdout.split()
    assert listed.returncode == 0 and len(examples) == 4 and all(venv in Path(p).parents for p in examples), listed
    validated = run(venv, "adl-policy", "validate", "--json", *examples)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert [json.loads(line)["valid"] for line in validated.stdout.splitlines()] == [True] * 4
    research = next(p for p in examples if p.endswith("research-agent.adl.json"))
    allowed = run(venv, "adl-policy", "check", research, "--connect", "api.example.com:443", "--protocol", "https")
    assert allowed.returncode == 0 and allowed.stdout.startswith("ALLOW"), allowed
    denied = run(venv, "adl-policy", "check", research, "--connect", "evil.example.net:443", "--protocol", "https")
    assert denied.returncode == 1 and denied.stdout.startswith("DENY"), denied


def test_adl_policy_rejects_a_document_against_the_shipped_schemas(venv: Path) -> None:
    bad = venv.parent / "bad.adl.json"
    bad.write_text(json.dumps({"adl_spec": "0.3.0", "name": "x", "description": "x", "version": "1.0.0\n"}))
    result = run(venv, "adl-policy", "validate", "--json", str(bad))
    codes = {e["code"] for e in json.loads(result.stdout)["errors"]}
    assert result.returncode == 1 and {"ADL-1003", "ADL-1006"} <= codes, result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="adl-exec needs root (cgroups and namespaces)")
def test_adl_exec_runs_an_allowed_and_stops_a_denied_action(venv: Path) -> None:
    policy = str(venv.parent / "venv-examples-coding-agent.adl.json")
    coding = next(p for p in run(venv, "adl-policy", "examples").stdout.split() if p.endswith("coding-agent.adl.json"))
    Path(policy).write_text(Path(coding).read_text())
    explained = run(venv, "adl-exec", "--adl", policy, "--explain", "--", "python3", "-c", "pass")
    assert explained.returncode == 0 and "runtime-baseline.yaml" in explained.stdout, explained
    assert str(venv) in explained.stdout, "the baseline is the installed package's"
    allowed = run(venv, "adl-exec", "--adl", policy, "--user", "nobody", "--", "python3", "-c", "print('inside')")
    assert allowed.returncode == 0 and allowed.stdout == "inside\n", allowed
    refused = run(venv, "adl-exec", "--adl", policy, "--user", "nobody", "--", "curl", "http://example.com")
    assert refused.returncode == 125 and "not allowed" in refused.stderr, refused
    blocked = run(venv, "adl-exec", "--adl", policy, "--user", "nobody", "--", "cat", "/etc/shadow")
    assert blocked.returncode != 0 and "Permission denied" in blocked.stderr, blocked


def test_adl_enforcerd_help_and_configuration(venv: Path) -> None:
    helped = run(venv, "adl-enforcerd", "--help")
    assert helped.returncode == 0 and "install-systemd" in helped.stdout, helped
    config = run(venv, "adl-enforcerd", "--print-config", "--json")
    assert config.returncode == 0, config.stderr
    settings = json.loads(config.stdout)
    for key in ("baseline", "regions"):
        assert venv in Path(settings[key]).parents and Path(settings[key]).is_file(), settings[key]


def test_install_systemd_from_the_installed_package(venv: Path) -> None:
    root = venv.parent / "root"
    result = run(venv, "adl-enforcerd", "install-systemd", "--root", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    unit = (root / "etc/systemd/system/adl-enforcerd.service").read_text()
    assert f"ExecStart={venv}/bin/adl-enforcerd\n" in unit
    config = (root / "etc/adl-enforcer/enforcer.toml").read_text()
    assert f"{venv}/lib/" in config and "runtime-baseline.yaml" in config
