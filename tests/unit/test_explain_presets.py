"""The daemon's Explain (and through it the client's policy_summary, which the MCP gateway reads)
shows what the runtime presets a document enables grant, exactly as `adl-policy explain --json`
does: the paths and variables they add beyond the document's permissions must not be hidden from a
reviewer who asks the daemon."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from enforcer.cli.policy import main as policy_main
from enforcer.data import PRESETS

from ..helpers.explaining import agent_document, explaining, runtime_presets


def _explained_by_daemon(tmp_path: Path, schemas: Any, document: Path, catalog: Path) -> dict[str, Any]:
    with explaining(tmp_path, schemas, document.parent, catalog) as explain:
        answer = explain()
        assert explain().policy_json == answer.policy_json
        shown: dict[str, Any] = orjson.loads(answer.policy_json)
        return shown


def _explained_by_cli(
    document: Path, catalog: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    monkeypatch.setenv("ADL_ENFORCER_PRESETS", str(catalog))
    capsys.readouterr()
    assert policy_main(["explain", "--json", str(document)]) == 0
    shown: dict[str, Any] = json.loads(capsys.readouterr().out)
    return shown


@pytest.mark.parametrize(
    ("names", "expect"),
    [
        (["python", "ca-certificates", "tmp"], "SSL_CERT_FILE"),
        (["python", "everything"], "REFUSED at launch: unknown preset(s) everything"),
        (None, None),
    ],
    ids=["presets", "unknown-preset", "none"],
)
def test_the_daemons_explain_shows_the_presets_as_adl_policy_explain_does(
    tmp_path: Path,
    schemas: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    names: list[str] | None,
    expect: str | None,
) -> None:
    document = agent_document(tmp_path / "policies", names)
    by_daemon = _explained_by_daemon(tmp_path, schemas, document, PRESETS)
    by_cli = _explained_by_cli(document, PRESETS, capsys, monkeypatch)
    assert by_daemon["runtime_presets"] == by_cli["runtime_presets"]
    # The digest covers the compile options, which the daemon's store and the command set apart.
    assert {k: v for k, v in by_daemon.items() if k != "digest"} == {k: v for k, v in by_cli.items() if k != "digest"}
    if expect is None:
        assert by_daemon["runtime_presets"] == []
    else:
        assert any(expect in line for line in by_daemon["runtime_presets"]), by_daemon["runtime_presets"]


def test_the_daemons_explain_reads_the_catalog_its_launches_use_and_sees_it_change(
    tmp_path: Path, schemas: Any
) -> None:
    catalog = tmp_path / "presets.yaml"
    shutil.copy(PRESETS, catalog)
    document = agent_document(tmp_path / "policies", ["python"])
    with explaining(tmp_path, schemas, document.parent, catalog) as explain:
        before = runtime_presets(explain())
        assert str(catalog) in before[0]
        catalog.write_text("presets: {}\n")  # the operator's catalog now lacks the preset
        after = runtime_presets(explain())
        assert after != before and any(line.startswith("REFUSED at launch") for line in after), after
        catalog.unlink()
        assert any(line.startswith("REFUSED at launch") for line in runtime_presets(explain()))
