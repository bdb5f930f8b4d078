from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.documents import EXAMPLES

INVOICE = str(EXAMPLES / "invoice-processor.adl.json")
INVOICE_AAIF = str(EXAMPLES / "invoice-processor.aaif.json")
RESEARCH = str(EXAMPLES / "research-agent.adl.json")
CODING = str(EXAMPLES / "coding-agent.adl.json")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enforcer.cli.policy", *args], capture_output=True, text=True, timeout=60
    )


def test_validate_examples_ok():
    result = run("validate", *map(str, sorted(EXAMPLES.glob("*.json"))))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": valid") == 4


def test_validate_invalid_and_json(spec, tmp_path: Path):
    bad = (
        spec
        / "Ironstead-Group__agent-definition-language/packages/adl-core/tests/fixtures/invalid/duplicate-tools.json"
    )
    result = run("validate", "--json", str(bad), RESEARCH)
    assert result.returncode == 1
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["valid"] is False and lines[0]["errors"][0]["code"] == "ADL-2002"
    assert lines[0]["errors"][0]["source"]["pointer"] == "/tools/1/name"
    assert lines[1]["valid"] is True


def test_validate_missing_file_is_usage_error(tmp_path: Path):
    assert run("validate", str(tmp_path / "nope.json")).returncode == 2


def test_explain(tmp_path: Path):
    result = run("explain", INVOICE, "--aaif", INVOICE_AAIF, "--home-region", "EU")
    assert result.returncode == 0, result.stderr
    assert "signature: verified" in result.stdout and "approve_payment" in result.stdout
    assert "data residency   EU (aaif), EU (adl)" in result.stdout
    data = json.loads(run("explain", CODING, "--json").stdout)
    assert data["network"] is None and data["execution"]["allow_shell"] is False


@pytest.mark.parametrize(
    "args,code,first",
    [
        (["--read", "/tmp/adl-demo/workspace/main.py"], 0, "ALLOW"),
        (["--write", "/tmp/adl-demo/reference/x"], 1, "DENY"),
        (["--read", "/tmp/adl-demo/workspace/.env"], 1, "DENY"),
        (["--exec", "sh -c 'cat /etc/passwd'"], 1, "DENY"),
        (["--exec", "python3 -m pytest"], 0, "ALLOW"),
        (["--connect", "example.com:443"], 1, "DENY"),
        (["--env", "LC_ALL"], 0, "ALLOW"),
        (["--env", "PYTHONPATH"], 1, "DENY"),
        (["--tool", "delete_path", "--args", '{"path": "x"}'], 3, "ASK"),
        (["--tool", "write_file", "--args", '{"path": 1}'], 1, "DENY"),
    ],
)
def test_check_exit_codes(args, code, first):
    result = run("check", CODING, *args)
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == first


def test_check_usage_errors():
    assert run("check", CODING).returncode == 2
    assert run("check", CODING, "--read", "/x", "--env", "A").returncode == 2
    assert run("check", CODING, "--tool", "x", "--args", "{bad").returncode == 2


def test_sign_keygen_roundtrip(tmp_path: Path):
    key = tmp_path / "k.pem"
    assert run("keygen", str(key)).returncode == 0
    assert key.stat().st_mode & 0o777 == 0o600
    assert run("keygen", str(key)).returncode == 2  # no silent overwrite
    doc = json.loads(Path(RESEARCH).read_text())
    doc["data_classification"]["sensitivity"] = "confidential"
    src = tmp_path / "c.json"
    src.write_text(json.dumps(doc))
    assert run("check", str(src), "--env", "LANG").returncode == 2  # unsigned confidential refused
    out = tmp_path / "signed.json"
    assert run("sign", str(src), "--key", str(key), "--out", str(out)).returncode == 0
    assert run("check", str(out), "--env", "LANG").returncode == 0
    tampered = json.loads(out.read_text())
    tampered["permissions"]["environment"]["allowed_variables"].append("AWS_*")
    out.write_text(json.dumps(tampered))
    result = run("check", str(out), "--env", "LANG")
    assert result.returncode == 2 and "ADL-4002" in result.stderr


def test_help_teaches():
    result = run("check", "--help")
    assert "exit codes" in result.stdout and "--connect" in result.stdout


def _write(tmp_path: Path, name: str, doc: dict) -> str:  # type: ignore[type-arg]
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _broad(lifecycle: dict) -> dict:  # type: ignore[type-arg]
    return {
        "adl_spec": "0.3.0",
        "name": "Broad",
        "description": "d",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
        "lifecycle": lifecycle,
        "permissions": {
            "network": {"allowed_hosts": ["*"], "allowed_ports": [443]},
            "environment": {"allowed_variables": ["*"]},
        },
    }


def test_validate_and_check_carry_the_must_and_should_warnings(tmp_path: Path):
    now = "2026-11-21T12:00:00Z"
    soon = _write(tmp_path, "soon.json", _broad({"status": "active", "sunset_date": "2026-12-01T00:00:00Z"}))
    text = run("validate", "--now", now, soon)
    assert text.returncode == 0, text.stdout + text.stderr
    for where in ("/permissions/network/allowed_hosts/0", "/permissions/environment/allowed_variables/0"):
        assert f"warning ENF-2003 Broad wildcard permission at {where}" in text.stdout
    assert "warning ENF-2007 Lifecycle warning at /lifecycle/sunset_date" in text.stdout
    (line,) = run("validate", "--json", "--now", now, soon).stdout.splitlines()
    report = json.loads(line)
    assert report["valid"] is True
    codes = sorted((w["code"], w["source"]["pointer"]) for w in report["warnings"])
    assert codes == [
        ("ENF-2003", "/permissions/environment/allowed_variables/0"),
        ("ENF-2003", "/permissions/network/allowed_hosts/0"),
        ("ENF-2007", "/lifecycle/sunset_date"),
    ]
    check = run("check", soon, "--now", now, "--env", "HOME")
    assert check.returncode == 0, check.stderr
    assert "warning ENF-2003" in check.stdout and "warning ENF-2007" in check.stdout
    decision = json.loads(run("check", soon, "--now", now, "--env", "HOME", "--json").stdout)
    assert decision["decision"] == "ALLOW"
    assert {w["code"] for w in decision["warnings"]} == {"ENF-2003", "ENF-2007"}


def test_deprecated_past_sunset_and_missing_adl_spec(tmp_path: Path):
    past = _write(tmp_path, "past.json", _broad({"status": "deprecated", "sunset_date": "2026-11-01T00:00:00Z"}))
    (line,) = run("validate", "--json", "--now", "2026-11-21T12:00:00Z", past).stdout.splitlines()
    assert "ADL-5003" in [w["code"] for w in json.loads(line)["warnings"]]
    no_spec = _broad({})
    del no_spec["adl_spec"]
    bare = _write(tmp_path, "bare.json", no_spec)
    (line,) = run("validate", "--json", bare).stdout.splitlines()
    errors = json.loads(line)["errors"]
    assert errors[0]["code"] == "ADL-1003" and "'adl_spec'" in errors[0]["detail"]
    assert "ENF-1005" not in line
    check = run("check", bare, "--env", "HOME", "--json")
    assert check.returncode == 2 and json.loads(check.stdout)["errors"][0]["code"] == "ADL-1003"


def test_required_capabilities_and_the_runtime_capability_flag(tmp_path: Path):
    adl = _broad({"status": "active"})
    adl["permissions"] = {"environment": {"allowed_variables": ["LANG"]}}
    aaif = {
        "sc_standard": "SC-006",
        "sc_version": "3.2.0",
        "agent": {
            "name": "Broad",
            "goal": "g",
            "compliance": {"safety_level": "strict"},
            "required_capabilities": ["tool.mcp"],
        },
    }
    adl_path, aaif_path = _write(tmp_path, "a.adl.json", adl), _write(tmp_path, "a.aaif.json", aaif)
    refused = run("check", adl_path, "--aaif", aaif_path, "--env", "LANG")
    assert refused.returncode == 2 and "tool.mcp" in refused.stderr
    assert [line.split()[0] for line in refused.stderr.splitlines()[1:]] == ["ENF-2010"]
    validated = run("validate", aaif_path)
    assert validated.returncode == 0 and "warning ENF-2010" in validated.stdout
    assert "refused when compiled" in validated.stdout
    allowed = run("check", adl_path, "--aaif", aaif_path, "--env", "LANG", "--runtime-capability", "tool.mcp")
    assert allowed.returncode == 0, allowed.stderr
