"""The fast schema check (jsonschema_rs) never accepts a document the pure-Python validator, which
words the errors, refuses: over every published and packaged example and fixture, and over seeded
random mutations of them, with the package's schemas and the published ones."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from enforcer.policy.jsonvalues import unsafe_integers
from enforcer.policy.loader import parse_document
from enforcer.policy.schema_errors import iter_leaf_errors
from enforcer.policy.specs import PACKAGED_SCHEMAS, PROFILES, SchemaSet, _portable_pattern, supported_schema_version
from tests.helpers.documents import EXAMPLES, SHARED_SPEC, base_adl, json_paths, set_at

# Values a mutation puts in place of another: each JSON type, strings that only one regex dialect
# or format parser might take, integers at the edges of exact float comparison.
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.0, 0.5, 2**53, 2**64, -(2**63) - 1, "", "x", "1.0.0\n", "١.٠.٠", "1.0.0",
    "read_file", "read_file\n", "a b", "\u00a0", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z\n",
    "2026-13-01T00:00:00Z", "2026-01-01", "https://example.com/x", "http://exa mple.com", "urn:adl:agent:a:b:1.0.0",
    "%zz", "x_acme", "x_acme\n", "com.acme", "com.acme\n", "EU", "internal", "restricted", [], [1, 1.0],
    ["a", "a"], [{"a": 1}, {"a": 1.0}], [{"a": 1}, {"a": True}], {}, {"x_acme": 1}, {"name": "t"},
]  # fmt: skip
ODD_KEYS = ["x_acme", "x_acme\n", "x-acme", "unknown", "com.acme", "com.acme\n", "", "\u00e9"]


def _documents(kind: str) -> list[dict[str, Any]]:
    roots = [EXAMPLES, SHARED_SPEC] if SHARED_SPEC.is_dir() else [EXAMPLES]
    found = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".json", ".yaml", ".yml") or not path.is_file() or "schema" in path.name:
                continue
            parsed = parse_document(path.read_bytes()[:1_000_000], path.name)
            if parsed.ok and parsed.kind == kind:
                found.append(parsed.document)
    return found


def _mutate(document: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    for _ in range(rng.randint(1, 3)):
        paths = list(json_paths(doc))
        roll = rng.random()
        if not paths or roll < 0.15:
            containers = [()] + [p for p in paths if isinstance(_get(doc, p), dict)]
            _get(doc, rng.choice(containers))[rng.choice(ODD_KEYS)] = copy.deepcopy(rng.choice(ODD_VALUES))
            continue
        path = rng.choice(paths)
        if roll < 0.3:
            parent = _get(doc, path[:-1])
            del parent[path[-1]]
        elif roll < 0.4 and isinstance(_get(doc, path), list) and _get(doc, path):
            items = _get(doc, path)
            items.append(copy.deepcopy(rng.choice(items)))
        elif roll < 0.55 and isinstance(_get(doc, path), str):
            set_at(doc, path, _get(doc, path) + rng.choice(["\n", " ", "\u0663", "$", "-"]))
        else:
            set_at(doc, path, copy.deepcopy(rng.choice(ODD_VALUES)))
    return doc


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _roots() -> list[Path]:
    return [PACKAGED_SCHEMAS, SHARED_SPEC] if SHARED_SPEC.is_dir() else [PACKAGED_SCHEMAS]


def _adl_agrees(schemas: SchemaSet, document: dict[str, Any]) -> tuple[bool, bool]:
    version = supported_schema_version(document.get("adl_spec")) or "0.3.0"
    profiles = (
        tuple(p for p in document.get("profiles", []) if isinstance(p, str) and p in PROFILES)
        if isinstance(document.get("profiles"), list)
        else ()
    )
    fast = schemas.adl_accepts(version, profiles, document)
    exact = not any(True for _ in iter_leaf_errors(schemas.adl_validator(version, profiles), document))
    return fast, exact


def _aaif_agrees(schemas: SchemaSet, document: dict[str, Any]) -> tuple[bool, bool]:
    fast = schemas.aaif_accepts("agent.schema.json", document)
    exact = not any(True for _ in iter_leaf_errors(schemas.aaif_validator("agent.schema.json"), document))
    return fast, exact


@pytest.mark.parametrize("root", _roots(), ids=lambda r: r.name)
def test_the_fast_check_is_built_for_the_shipped_and_published_schemas(root: Path) -> None:
    schemas = SchemaSet(root)
    from enforcer.policy.specs import _aaif_check, _adl_check

    for version in ("0.1.0", "0.2.0", "0.3.0"):
        assert _adl_check(root, version, ()) is not None
        assert _adl_check(root, version, tuple(PROFILES)) is not None
    assert _aaif_check(root, "agent.schema.json") is not None
    assert schemas.adl_accepts("0.3.0", (), base_adl())


@pytest.mark.parametrize("root", _roots(), ids=lambda r: r.name)
@pytest.mark.parametrize("kind", ["adl", "aaif"])
def test_the_fast_check_accepts_only_what_the_exact_validator_accepts(root: Path, kind: str) -> None:
    schemas = SchemaSet(root)
    agrees = _adl_agrees if kind == "adl" else _aaif_agrees
    originals = _documents(kind) + ([base_adl()] if kind == "adl" else [])
    assert len(originals) >= (20 if kind == "adl" else 3), len(originals)
    rng = random.Random(f"{root.name}:{kind}")
    cases = originals + [_mutate(rng.choice(originals), rng) for _ in range(400)]
    tally = {"accepted": 0, "refused": 0}
    for document in cases:
        fast, exact = agrees(schemas, document)
        assert not fast or exact, json.dumps(document, default=str)[:2000]
        # A document the fast check refuses is worded by the exact one: agreeing there too keeps
        # that slower path for documents that fail (and those with integers beyond 2^53, by design).
        if not unsafe_integers(document):
            assert fast == exact, ("the fast check refused a valid document", json.dumps(document, default=str)[:2000])
        tally["accepted" if fast else "refused"] += 1
    assert tally["accepted"] >= 10 and tally["refused"] >= 100, tally


@pytest.mark.parametrize(
    "pattern,portable",
    [
        (r"^\d+\.\d+\.\d+$", True),
        (r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$", True),
        (r"^(?:x|y)-[a-z]{2,8}$", True),
        (r"^a.b$", False),  # `.`: ECMA-262 excludes \r and U+2028/9, Python only \n
        (r"^\s*$", False),  # Unicode whitespace in ECMA-262, ASCII with re.ASCII
        (r"^\w+$", False),
        (r"\bword", False),
        (r"(?=a)a", False),
        (r"(?P<n>a)", False),
        (r"a{", False),
        (r"(a", False),
        (r"\u0041", False),
    ],
)
def test_patterns_outside_the_shared_subset_are_not_given_the_fast_check(pattern: str, portable: bool) -> None:
    assert _portable_pattern(pattern) is portable


def test_a_schema_with_a_keyword_read_differently_is_validated_exactly(tmp_path: Path) -> None:
    # multipleOf: jsonschema divides floats, jsonschema_rs does not; 0.3 is no multiple of 0.1 to it.
    (tmp_path / "adl").mkdir()
    (tmp_path / "aaif").mkdir()
    core = json.loads((PACKAGED_SCHEMAS / "adl" / "core-0.3.0.json").read_text())
    core["properties"]["cost"] = {"type": "number", "multipleOf": 0.1}
    (tmp_path / "adl" / "core-0.3.0.json").write_text(json.dumps(core))
    schemas = SchemaSet(tmp_path)
    document = base_adl(cost=0.3)
    assert not schemas.adl_accepts("0.3.0", (), document)
    assert any(e.validator == "multipleOf" for e in iter_leaf_errors(schemas.adl_validator("0.3.0", ()), document))


@pytest.mark.parametrize(
    "schema,portable",
    [
        ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "string", "pattern": "^[a-z]+$"}}}, True),
        ({"$ref": "urn:example:core"}, True),
        ({"properties": {"id": {"type": "string"}}, "required": ["id"], "comment": "an annotation"}, True),
        # A pointer into a part no walk looks at as a schema (here a default holding multipleOf).
        ({"$ref": "#/properties/a/default", "properties": {"a": {"default": {"multipleOf": 0.1}}}}, False),
        ({"$ref": "#anchor"}, False),
        ({"$dynamicRef": "#meta"}, False),
        ({"$defs": {"a": {"multipleOf": 0.1}}}, False),
        ({"properties": [{"type": "string"}]}, False),
        ({"allOf": {"type": "string"}}, False),
        ({"items": [{"type": "string"}]}, False),
        ({"patternProperties": {"^a.$": {}}}, False),
        ({"dependencies": {"a": ["b"]}}, False),
        ({"$id": "urn:example:root", "type": "object"}, True),
        ({"$defs": {"a": {"$id": "urn:example:a"}}}, False),
    ],
)
def test_schemas_outside_the_shared_subset_are_not_given_the_fast_check(schema: dict, portable: bool) -> None:
    from enforcer.policy.specs import _portable

    assert _portable(schema, {"urn:example:core"}) is portable


def _schema_patterns(root: Path) -> set[str]:
    found: set[str] = set()
    stack: list[Any] = [
        json.loads(p.read_text())
        for p in root.rglob("*.json")
        if "schema" in p.name or p.parent.name in ("adl", "aaif")
    ]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.add(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found |= set(node["patternProperties"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return {p for p in found if _portable_pattern(p)}


def test_portable_patterns_match_alike_in_both_engines() -> None:
    import jsonschema_rs

    from enforcer.policy.ecma import ecma_pattern

    patterns = _schema_patterns(PACKAGED_SCHEMAS) | {r"^[\d.-]+$", r"^(?:ab|c)+\D$", r"^[^a-z]{1,2}$"}
    assert len(patterns) >= 8, patterns
    alphabet = ["a", "z", "A", "_", "-", ".", "0", "9", "\u0663", "\n", "\r", "\u2028", " ", "\u00a0", "x", "\u00e9",
                "\U0001f600", "$", "^", "b", "c", "com", "x_", "1.0.0", "on_", "aaif-"]  # fmt: skip
    rng = random.Random("patterns")
    for pattern in sorted(patterns):
        check = jsonschema_rs.Draft202012Validator({"pattern": pattern}, pattern_options=jsonschema_rs.RegexOptions())
        for _ in range(300):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
            assert check.is_valid(text) == bool(ecma_pattern(pattern).search(text)), (pattern, text)


def _fast_and_exact(schema: dict[str, Any], instance: Any, asserted: bool = True) -> tuple[bool, bool]:
    from enforcer.policy.schema_errors import AAIFSchemaValidator, ADLSchemaValidator
    from enforcer.policy.specs import _accepts, _check

    exact_validator = (ADLSchemaValidator if asserted else AAIFSchemaValidator)(schema)
    exact = not any(True for _ in iter_leaf_errors(exact_validator, instance))
    return _accepts(_check(schema, [], asserted), instance), exact


def _inner_resource(keyword: str) -> dict[str, Any]:
    # The same reference names an integer from the outer resource and a string from the inner one.
    inner = {"$id": "urn:example:inner", "$defs": {"y": {"type": "string"}}, "$ref": "#/$defs/y"}
    schema: dict[str, Any] = {"$id": "urn:example:outer", "$defs": {"y": {"type": "integer"}}, keyword: inner}
    if keyword == "if":
        schema["then"] = False
    return schema


@pytest.mark.parametrize(
    "schema,instance",
    [
        # jsonschema resolves a reference inside not, contains and if against the enclosing resource,
        # jsonschema_rs against the subschema's own $id: each reads another schema.
        (_inner_resource("not"), 1),
        (_inner_resource("contains"), ["s"]),
        (_inner_resource("if"), 1),
        ({"properties": {"a": _inner_resource("not")}}, {"a": 1}),
        ({"$defs": {"e": _inner_resource("not")}, "$ref": "#/$defs/e"}, 1),
    ],
)
def test_a_reference_inside_an_embedded_resource_is_not_read_two_ways(schema: dict, instance: Any) -> None:
    fast, exact = _fast_and_exact(schema, instance)
    assert not exact
    assert not fast


@pytest.mark.parametrize(
    "document",
    [
        # jsonschema_rs reads a tuple as an array; to the wording validator it is no JSON type at all.
        base_adl(tools=({"name": "t", "description": "d"},)),
        base_adl(tools=[{"name": "t", "description": "d", "examples": ({"name": "e"},)}]),
    ],
    ids=["tools", "examples"],
)
def test_values_outside_json_are_left_to_the_exact_validator(document: dict[str, Any]) -> None:
    # The loader refuses such values; the check must not accept them when handed one directly.
    schemas = SchemaSet(PACKAGED_SCHEMAS)
    fast, exact = _adl_agrees(schemas, document)
    assert not fast or exact
    assert not fast


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_value_that_is_no_json_number_is_left_to_the_exact_validator(value: float) -> None:
    # jsonschema_rs reads NaN and the infinities as no number, so the bounds do not apply to them.
    fast, exact = _fast_and_exact({"properties": {"a": {"minimum": 0, "maximum": 10}}}, {"a": value})
    assert not fast or exact
    assert not fast


@pytest.mark.parametrize(
    "schema,instance",
    [
        ({"properties": {"a": {"const": float("nan")}}}, {"a": None}),
        ({"properties": {"a": {"enum": [float("inf"), 1]}}}, {"a": None}),
        ({"properties": {"a": {"const": {"b": [float("-inf")]}}}}, {"a": {"b": [None]}}),
    ],
    ids=["const-nan", "enum-inf", "nested-inf"],
)
def test_a_schema_holding_a_value_that_is_no_json_number_is_validated_exactly(schema: dict, instance: Any) -> None:
    # Python's json module reads NaN and Infinity in a schema file; jsonschema_rs takes them for null.
    fast, exact = _fast_and_exact(schema, instance)
    assert not exact
    assert not fast


@pytest.mark.parametrize(
    "reference",
    [
        "HTTPS://ADL-SPEC.ORG/0.3/schema.json",
        "https://adl-spec.org:443/0.3/schema.json",
        "https://adl-spec.org/0.3/../0.3/schema.json",
        "https://adl-spec.org/0.3/schema%2Ejson",
        "URN:adl-enforcer:schema:adl:core",
    ],
)
def test_a_reference_only_jsonschema_rs_resolves_is_left_to_the_exact_validator(reference: str) -> None:
    # jsonschema_rs normalises a URI before looking it up; the wording validator's registry does not
    # and cannot resolve it: the fast check must not accept what the exact validator cannot check.
    from enforcer.policy.schema_errors import adl_validator
    from enforcer.policy.specs import _accepts, _check

    target = {"$id": "https://adl-spec.org/0.3/schema.json", "type": "integer"}
    resources = [("https://adl-spec.org/0.3/schema.json", target), ("urn:adl-enforcer:schema:adl:core", target)]
    schema = {"allOf": [{"$ref": reference}]}
    from referencing.exceptions import Unresolvable

    with pytest.raises(Unresolvable):
        list(iter_leaf_errors(adl_validator(schema, resources), 1))
    assert not _accepts(_check(schema, resources, True), 1)


@pytest.mark.parametrize(
    "reference",
    [
        "https://adl-spec.org/0.3/schema.json",
        "https://adl-spec.org/0.3/schema.json#",
        "urn:adl-enforcer:schema:adl:core",
    ],
)
def test_a_reference_to_a_registered_resource_gets_the_fast_check(reference: str) -> None:
    from enforcer.policy.specs import _accepts, _check

    target = {"$id": "https://adl-spec.org/0.3/schema.json", "type": "integer", "properties": {"a": {"$ref": ""}}}
    resources = [("https://adl-spec.org/0.3/schema.json", target), ("urn:adl-enforcer:schema:adl:core", target)]
    check = _check({"allOf": [{"$ref": reference}]}, resources, True)
    assert _accepts(check, 1) and not _accepts(check, "1")


@pytest.mark.parametrize("resource", [True, False])
def test_a_boolean_resource_gets_the_fast_check(resource: bool) -> None:
    from enforcer.policy.specs import _accepts, _check

    check = _check({"$ref": "urn:example:any"}, [("urn:example:any", resource)], True)
    assert check is not None and _accepts(check, {"a": 1}) is resource


# Values at the edges where a regex engine, a format parser or a number comparison may differ.
EDGE_VALUES: list[Any] = [
    "1.0.0\r", "1.0.0\u2028", "\uff11.0.0", " 1.0.0", "x_\u0663", "X_acme", "\u212a", "\u0130", "e\u0301", "a\x00",
    "\U0001f600", "\U0001f600\U0001f600", "internal\n", "INTERNAL", "restricted\u200b",
    "http://[::1]/", "http://[v1.x]/", "HTTP://A", "a:b", "urn:", ":x", "http://%41", "http://ex.com/%", "file:///etc",
    "x://", "1http://x", "http://a\u00e9.com", "mailto:a@b", "http://a:b@c:99999/", "http://[::1", "//x", "#frag",
    "2026-06-30T23:59:60Z", "2026-01-01T00:00:00+24:00", "2026-01-01t00:00:00z", "2026-01-01T00:00:00.123456789Z",
    "2026-01-01T00:00:00-00:00", "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z", "2026-01-01T00:00:00+0100",
    "2026-01-01 00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:00:00",
    -0.0, 1e16, 1e300, 2**53 - 1, -(2**53 - 1), 0.1, 1.5, 2.0, 3, 100, -2,
    [True, 1], [0, False], [0, -0.0], [{"a": [1]}, {"a": [1.0]}], ["x", "X"], [None, None], [[], []], [{}, {}],
]  # fmt: skip


def _judge(schemas: SchemaSet, kind: str, document: dict[str, Any]) -> Any:
    """The document's check as the compiler runs it: (fast, exact) for one document, None when its
    schema is unknown here."""
    if kind == "adl":
        return lambda doc: _adl_agrees(schemas, doc)
    from enforcer.policy.aaif import schema_file_for
    from enforcer.policy.specs import SpecMissing

    name = schema_file_for(document)
    try:
        validator = schemas.aaif_validator(name)
    except SpecMissing:
        return None
    return lambda doc: (schemas.aaif_accepts(name, doc), not any(True for _ in iter_leaf_errors(validator, doc)))


@pytest.mark.parametrize("root", _roots(), ids=lambda r: r.name)
@pytest.mark.parametrize("kind", ["adl", "aaif"])
def test_one_edge_value_in_a_valid_document_is_judged_alike(root: Path, kind: str) -> None:
    # Each AAIF document against the schema it names (agent-state, conformance-report, ...), every
    # valid one with one member replaced by an edge value: regex, format and number edges meet the
    # real schemas one at a time.
    schemas = SchemaSet(root)
    cases = []
    for document in _documents(kind) + ([base_adl()] if kind == "adl" else []):
        agrees = _judge(schemas, kind, document)
        if agrees is not None and agrees(document)[1]:
            cases += [(agrees, document, path) for path in json_paths(document)]
    assert len({id(document) for _, document, _ in cases}) >= (20 if kind == "adl" else 8)
    rng = random.Random(f"edges:{root.name}:{kind}")
    tally = {"accepted": 0, "refused": 0}
    for agrees, document, path in rng.sample(cases, min(len(cases), 400)):
        for value in rng.sample(EDGE_VALUES, 3):
            changed = copy.deepcopy(document)
            set_at(changed, path, copy.deepcopy(value))
            fast, exact = agrees(changed)
            assert not fast or exact, (path, value)
            if not unsafe_integers(changed):
                assert fast == exact, ("the fast check refused a valid document", path, value)
            tally["accepted" if fast else "refused"] += 1
    assert tally["accepted"] >= 100 and tally["refused"] >= 100, tally
