"""Runtime presets: the catalog shipped with the package parses, documents ask for presets through
ADL's extension mechanism (0.3 and 0.1/0.2 spellings), unknown names are refused."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from enforcer import data
from enforcer.policy import presets


def shipped() -> presets.Catalog:
    raw = data.PRESETS.read_bytes()
    return presets.parse_catalog(raw, YAML(typ="safe").load(raw), str(data.PRESETS))


def test_the_shipped_catalog_has_the_documented_presets() -> None:
    catalog = shipped()
    assert {"python", "node", "git", "ca-certificates", "tmp"} <= set(catalog.presets)
    assert all(p.description for p in catalog.presets.values())
    ca = catalog.presets["ca-certificates"]
    assert {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"} <= set(ca.env)
    assert catalog.presets["tmp"].session_tmp and not catalog.presets["python"].session_tmp
    assert catalog.digest.startswith("sha256:")


def test_documents_ask_through_the_extension_of_their_adl_version() -> None:
    v03 = {"permissions": {"extensions": {"adl-enforcer.runtime": {"presets": ["git", "python", "git"]}}}}
    assert presets.requested(v03) == ("git", "python")
    v02 = {"permissions": {"x_adl_enforcer_presets": ["tmp"]}}
    assert presets.requested(v02) == ("tmp",)
    assert presets.requested({"permissions": {}}) == () and presets.requested({}) == ()
    with pytest.raises(presets.PresetError, match="list of preset names"):
        presets.requested({"permissions": {"x_adl_enforcer_presets": "python"}})


def test_unknown_presets_are_refused_and_the_digest_covers_the_names() -> None:
    catalog = shipped()
    with pytest.raises(presets.PresetError, match="unknown preset"):
        presets.select(catalog, ("python", "everything"))
    a = presets.combined_digest("sha256:base", catalog, ("python",))
    b = presets.combined_digest("sha256:base", catalog, ("python", "git"))
    assert a != b and a != "sha256:base"


def test_a_malformed_catalog_is_refused() -> None:
    with pytest.raises(presets.PresetError, match="absolute paths"):
        presets.parse_catalog(b"", {"x": {"read": ["relative/path"]}}, "test")
    with pytest.raises(presets.PresetError, match="unknown keys"):
        presets.parse_catalog(b"", {"x": {"grant_everything": True}}, "test")
