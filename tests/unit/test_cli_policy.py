from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES

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
