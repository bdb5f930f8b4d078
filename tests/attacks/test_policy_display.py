"""A policy document from an untrusted author: its name carries terminal controls. Whoever reviews
it with `adl-policy explain` or `adl-exec --explain` before use would see the lines after the name
concealed (SGR 8) or rewritten (cursor up, erase line), e.g. `hosts: *` shown as one host. What
the explanation prints must show such characters escaped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "examples" / "coding-agent.adl.json"
HOSTILE_NAME = "Coding Agent\x1b[8m\u009b1A\u202e"


@pytest.fixture
def hostile_document(tmp_path: Path) -> Path:
    document = json.loads(EXAMPLE.read_text())
    document["name"] = HOSTILE_NAME
    document["permissions"]["network"] = {
        "allowed_hosts": ["*"],
        "allowed_ports": [443],
        "allowed_protocols": ["https"],
    }
    path = tmp_path / "downloaded.adl.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ("enforcer.cli.policy", "explain", "{doc}"),
        ("enforcer.cli.policy", "validate", "{doc}"),
        ("enforcer.cli.policy", "check", "{doc}", "--connect", "api.example.com:443", "--protocol", "https"),
        ("enforcer.cli.exec", "--adl", "{doc}", "--explain", "--", "python3", "-c", "pass"),
    ],
)
def test_an_explanation_shows_the_documents_controls_escaped(hostile_document: Path, argv: tuple[str, ...]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", *(a.format(doc=hostile_document) for a in argv)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout + run.stderr
    for control in ("\x1b", "\u009b", "\u202e"):
        assert control not in out, (argv, control)
    if "explain" in argv:
        assert "Coding Agent\\x1b[8m" in out and "hosts: *" in out


PRESETS = ["python", "ca-certificates", "tmp"]


def _with_presets(tmp_path: Path, names: list[str]) -> Path:
    document = json.loads(EXAMPLE.read_text())
    document["permissions"]["extensions"] = {"adl-enforcer.runtime": {"presets": names}}
    path = tmp_path / "downloaded.adl.json"
    path.write_text(json.dumps(document))
    return path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60)


def test_explain_shows_what_the_runtime_presets_grant_as_adl_exec_does(tmp_path: Path) -> None:
    """A downloaded document enables presets: paths (the CA store, /usr/lib/python3), variables
    and a temp directory its permissions do not list. The reviewer running `adl-policy explain`
    must see every line `adl-exec --explain` shows for them."""
    document = _with_presets(tmp_path, PRESETS)
    launch = _run("enforcer.cli.exec", "--adl", str(document), "--explain", "--json", "--", "python3", "-c", "pass")
    assert launch.returncode == 0, launch.stderr
    granted = next(layer for layer in json.loads(launch.stdout)["layers"] if layer["name"] == "presets")["details"]
    assert any("SSL_CERT_FILE" in line for line in granted) and any("TMPDIR" in line for line in granted)
    shown = _run("enforcer.cli.policy", "explain", str(document))
    assert shown.returncode == 0, shown.stderr
    assert "presets       runtime presets (ADL extension adl-enforcer.runtime) add to the above:" in shown.stdout
    for line in granted:
        assert f"              {line}\n" in shown.stdout
    as_json = _run("enforcer.cli.policy", "explain", "--json", str(document))
    assert json.loads(as_json.stdout)["runtime_presets"] == granted


def test_explain_says_a_document_with_an_unknown_preset_is_refused_at_launch(tmp_path: Path) -> None:
    document = _with_presets(tmp_path, ["python", "everything"])
    launch = _run("enforcer.cli.exec", "--adl", str(document), "--explain", "--", "python3", "-c", "pass")
    assert launch.returncode == 125 and "unknown preset(s) everything" in launch.stderr
    shown = _run("enforcer.cli.policy", "explain", str(document))
    assert shown.returncode == 0 and "REFUSED at launch: unknown preset(s) everything" in shown.stdout
