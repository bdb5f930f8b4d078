"""Schema loading: the package's own schemas are the default, and patterns keep JSON Schema's meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from enforcer.policy.adl import validate_adl
from enforcer.policy.specs import PACKAGED_SCHEMAS, SchemaSet, SpecMissing, ecma_pattern, spec_root
from enforcer.settings.launch import read as read_settings
from tests.helpers.documents import NOW, base_adl


def _codes(schemas: SchemaSet, document: dict) -> list[tuple[str, str]]:
    findings, _ = validate_adl(document, schemas, NOW)
    return [(f.code, f.pointer) for f in findings if f.severity == "error"]


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0", "0.3.0"])
def test_trailing_newline_does_not_satisfy_an_anchored_pattern(schemas: SchemaSet, version: str) -> None:
    tool = {"name": "read_file\n", "description": "reads"}
    codes = _codes(schemas, base_adl(adl_spec=version, version="1.0.0\n", tools=[tool]))
    assert ("ADL-1006", "/version") in codes and ("ADL-1006", "/tools/0/name") in codes, codes
    assert _codes(schemas, base_adl(adl_spec=version, tools=[{"name": "read_file", "description": "reads"}])) == []


def test_digits_are_ascii(schemas: SchemaSet) -> None:
    assert ("ADL-1006", "/version") in _codes(schemas, base_adl(version="١.٠.٠"))
    assert _codes(schemas, base_adl(version="10.20.30")) == []


def test_formats_are_checked_inside_the_referenced_core(schemas: SchemaSet) -> None:
    # The core is reached by $ref from the composed schema; timestamps there are still checked.
    bad = base_adl(lifecycle={"status": "active", "effective_date": "yesterday"})
    assert any(pointer == "/lifecycle/effective_date" for _, pointer in _codes(schemas, bad))
    good = base_adl(lifecycle={"status": "active", "effective_date": "2026-01-01T00:00:00Z"})
    assert _codes(schemas, good) == []


def test_ecma_pattern_translation() -> None:
    assert ecma_pattern("^a$").search("a") and not ecma_pattern("^a$").search("a\n")
    assert ecma_pattern(r"^[$]\$$").search("$$") and not ecma_pattern(r"^[$]\$$").search("$$\n")
    assert not ecma_pattern(r"^\d$").search("٣")


def test_override_must_hold_schemas(tmp_path: Path) -> None:
    spec_dir = read_settings({"ADL_ENFORCER_SPEC_DIR": str(tmp_path)}).spec_dir
    assert spec_dir == tmp_path
    with pytest.raises(SpecMissing, match="ADL_ENFORCER_SPEC_DIR"):
        spec_root(spec_dir)
    assert read_settings({}).spec_dir is None
    assert spec_root(None) == spec_root() == PACKAGED_SCHEMAS


def test_extension_member_names_end_at_the_end(schemas: SchemaSet) -> None:
    # 0.1: x_ members anywhere (patternProperties); 0.2 and 0.3: reverse-domain keys of `extensions`.
    assert _codes(schemas, base_adl(adl_spec="0.1.0", x_acme_id=1)) == []
    assert ("ADL-1004", "/x_acme_id\n") in _codes(schemas, base_adl(adl_spec="0.1.0", **{"x_acme_id\n": 1}))
    for version in ("0.2.0", "0.3.0"):
        good = base_adl(adl_spec=version, lifecycle={"status": "active", "extensions": {"com.acme": {}}})
        assert _codes(schemas, good) == []
        bad = base_adl(adl_spec=version, lifecycle={"status": "active", "extensions": {"com.acme\n": {}}})
        assert any(pointer.startswith("/lifecycle/extensions") for _, pointer in _codes(schemas, bad)), version


def test_adl_0_1_permissions_hold_a_domain(schemas: SchemaSet) -> None:
    # The ADL 0.1 draft: permissions, when present, is an object with one or more permission domains.
    for permissions in ({}, {"x_acme_note": {}}):
        codes = _codes(schemas, base_adl(adl_spec="0.1.0", permissions=permissions))
        assert any(pointer == "/permissions" for _, pointer in codes), (permissions, codes)
    assert _codes(schemas, base_adl(adl_spec="0.1.0", permissions={"network": {"allowed_hosts": ["a.example"]}})) == []


def test_a_valid_document_compiles_without_the_wording_validator_or_condition_libraries() -> None:
    import json
    import subprocess
    import sys

    probe = """
import json, sys
from datetime import UTC, datetime
from enforcer.documents import compile_documents
from enforcer.policy.errors import DocumentRejected
from tests.helpers.documents import base_adl

compile_documents(base_adl(tools=[{"name": "read_file", "description": "reads"}]), None, None, datetime.now(UTC))
loaded = sorted(sys.modules)
try:
    compile_documents(base_adl(version="1.0.0\\\\n"), None, None, datetime.now(UTC))
except DocumentRejected as exc:
    codes = [(f.code, f.pointer) for f in exc.findings]
print(json.dumps({"loaded": loaded, "codes": codes, "after": sorted(sys.modules)}))
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=root)
    result = json.loads(out.stdout)
    heavy = {"jsonschema", "referencing", "enforcer.policy.schema_errors", "ruamel.yaml"}
    heavy |= {"jmespath", "json_logic", "jsonpath_ng"}
    assert not heavy & set(result["loaded"]), heavy & set(result["loaded"])
    assert "jsonschema_rs" in result["loaded"]
    # A refused document is worded by the pure-Python validator, with the usual code and pointer.
    assert ["ADL-1006", "/version"] in result["codes"], result["codes"]
    assert {"jsonschema", "enforcer.policy.schema_errors"} <= set(result["after"])
