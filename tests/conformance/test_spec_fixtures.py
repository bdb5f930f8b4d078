"""Conformance against ../shared/spec: with the package's own schemas, every fixture gives the outcome its source
expects."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from enforcer.policy.aaif import validate_aaif
from enforcer.policy.adl import validate_adl
from enforcer.policy.loader import parse_document
from enforcer.policy.signature import verify
from tests.helpers.documents import NOW, SHARED_SPEC

if not SHARED_SPEC.is_dir():
    pytest.skip(f"the published specification tree is not at {SHARED_SPEC}", allow_module_level=True)
SPEC = SHARED_SPEC
EXPECTED = json.loads((SPEC / "expected-results.json").read_text())
ADL_FIXTURES = SPEC / "Ironstead-Group__agent-definition-language/packages/adl-core/tests/fixtures"
ADL_SPEC = SPEC / "agent-definition-language__specification"
AAIF = SPEC / "Observalytics-SL__aaif"


def _codes(schemas, path: Path) -> list[str]:
    parsed = parse_document(path.read_bytes(), path.name)
    if not parsed.ok:
        return [f.code for f in parsed.findings]
    findings, _ = validate_adl(parsed.document, schemas, NOW)
    return [f.code for f in findings if f.severity == "error"]


@pytest.mark.parametrize("entry", EXPECTED["adl"]["valid"], ids=lambda e: e["file"])
def test_adl_valid_fixture(schemas, entry):
    assert _codes(schemas, ADL_FIXTURES / entry["file"]) == []


@pytest.mark.parametrize("entry", EXPECTED["adl"]["invalid"], ids=lambda e: e["file"])
def test_adl_invalid_fixture_reports_expected_code(schemas, entry):
    codes = _codes(schemas, ADL_FIXTURES / entry["file"])
    assert entry["expect"] in codes, codes


@pytest.mark.parametrize("name", EXPECTED["adl_spec_conformance"]["valid"])
def test_spec_conformance_valid(schemas, name):
    assert _codes(schemas, ADL_SPEC / "conformance" / name) == []


@pytest.mark.parametrize("entry", EXPECTED["adl_spec_conformance"]["invalid"], ids=lambda e: e["file"])
def test_spec_conformance_invalid(schemas, entry):
    assert _codes(schemas, ADL_SPEC / "conformance" / entry["file"]) != []


CORE_EXAMPLES = sorted(ADL_SPEC.glob("core/0.[123].0/examples/*"))
PROFILE_EXAMPLES = sorted(
    p for p in ADL_SPEC.glob("profiles/*/1.0/examples/**/*.json") if "governance-record" not in p.name
)


@pytest.mark.parametrize("path", CORE_EXAMPLES + PROFILE_EXAMPLES, ids=lambda p: str(p.relative_to(ADL_SPEC)))
def test_spec_examples_validate(schemas, path):
    assert _codes(schemas, path) == []


def test_examples_were_found():
    assert len(CORE_EXAMPLES) == 9 and len(PROFILE_EXAMPLES) >= 10


def test_unsupported_next_version_is_rejected(schemas):
    for path in sorted(ADL_SPEC.glob("core/_next/examples/*")):
        assert "ADL-2001" in _codes(schemas, path)


def _aaif_findings(schemas, path: Path):
    parsed = parse_document(path.read_bytes(), path.name)
    assert parsed.ok and parsed.kind == "aaif"
    return [f for f in validate_aaif(parsed.document, schemas) if f.severity == "error"]


@pytest.mark.parametrize("entry", EXPECTED["aaif"]["valid"], ids=lambda e: e["file"])
def test_aaif_valid_fixture(schemas, entry):
    assert _aaif_findings(schemas, AAIF / "tests/conformance" / entry["file"]) == []


@pytest.mark.parametrize("path", sorted((AAIF / "examples").glob("*.json")), ids=lambda p: p.name)
def test_aaif_examples_validate(schemas, path):
    assert _aaif_findings(schemas, path) == []


@pytest.mark.parametrize("entry", EXPECTED["aaif"]["invalid"], ids=lambda e: e["file"])
def test_aaif_invalid_fixture_rejected_at_pointer(schemas, entry):
    errors = _aaif_findings(schemas, AAIF / "tests/conformance" / entry["file"])
    assert errors
    assert any(
        f.pointer == entry["pointer"]
        or f.pointer.startswith(entry["pointer"] + "/")
        or (entry["pointer"] == "" and f.pointer == "")
        for f in errors
    ), [f.pointer for f in errors]


VECTORS = ADL_SPEC / "core/0.3.0/test-vectors/verify/vectors"


@pytest.mark.parametrize(
    "name,expected",
    [
        ("001-valid-self-signed-tofu", "verified"),
        ("040-signature-tampered-post-signing", "invalid"),
        ("042-signature-wrong-key", "invalid"),
    ],
)
def test_signature_vectors(name, expected):
    passport = json.loads((VECTORS / f"{name}.json").read_text())["input"]["passport"]
    result = verify(copy.deepcopy(passport))
    assert result.state == expected
    if expected == "invalid":
        assert [f.code for f in result.findings] == ["ADL-4002"]
