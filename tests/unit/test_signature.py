from __future__ import annotations

import copy

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enforcer.policy import DocumentRejected
from enforcer.policy.signature import sign_ed25519, verify
from tests.helpers.documents import base_adl, compile_doc, get_at, json_paths, set_at

PERMISSIONS = {
    "network": {"allowed_hosts": ["api.example.com"], "allowed_ports": [443], "deny_private": True},
    "filesystem": {"allowed_paths": [{"path": "/data/**", "access": "read"}], "denied_paths": ["/data/k"]},
    "environment": {"allowed_variables": ["APP_*"]},
    "execution": {"allowed_commands": ["python3"], "allow_shell": False},
    "resource_limits": {"max_memory_mb": 128},
}


@pytest.fixture(scope="module")
def signed() -> dict:
    doc = base_adl(permissions=PERMISSIONS, data_classification={"sensitivity": "confidential"})
    return sign_ed25519(doc, Ed25519PrivateKey.generate())


def test_signed_document_verifies_and_compiles(schemas, signed):
    assert verify(signed).state == "verified"
    assert compile_doc(schemas, signed).signature == "verified"


def _changed(old):
    return (not old) if isinstance(old, bool) else (old + 1 if isinstance(old, int) else str(old) + "x")


@pytest.mark.parametrize("path", list(json_paths(PERMISSIONS, leaves_only=True)), ids=lambda p: "/".join(map(str, p)))
def test_any_permission_tampered_after_signing_fails(schemas, signed, path):
    tampered = copy.deepcopy(signed)
    set_at(tampered, ("permissions", *path), _changed(get_at(tampered, ("permissions", *path))))
    assert verify(tampered).state == "invalid"
    with pytest.raises(DocumentRejected) as exc:
        compile_doc(schemas, tampered)
    assert "ADL-4002" in [f.code for f in exc.value.findings]


def test_added_permission_fails(schemas, signed):
    tampered = copy.deepcopy(signed)
    tampered["permissions"]["network"]["allowed_hosts"].append("evil.example.com")
    assert verify(tampered).state == "invalid"


def test_key_swapped_fails(signed):
    tampered = copy.deepcopy(signed)
    other = sign_ed25519(base_adl(), Ed25519PrivateKey.generate())
    tampered["cryptographic_identity"]["public_key"] = other["cryptographic_identity"]["public_key"]
    assert verify(tampered).state == "invalid"


def test_confidential_unsigned_refused_unless_waived(schemas):
    doc = base_adl(data_classification={"sensitivity": "restricted"})
    with pytest.raises(DocumentRejected) as exc:
        compile_doc(schemas, doc)
    assert [f.code for f in exc.value.findings if f.severity == "error"] == ["ENF-2006"]
    assert compile_doc(schemas, doc, require_signature=False).signature == "absent"


def test_weak_algorithm(schemas):
    doc = base_adl(cryptographic_identity={"public_key": {"algorithm": "RS1", "value": "AAAA"}})
    with pytest.raises(DocumentRejected) as exc:
        compile_doc(schemas, doc)
    assert "ADL-4001" in [f.code for f in exc.value.findings]


def test_short_rsa_key_is_weak():
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from enforcer.policy.signature import key_strength_problem

    key = rsa.generate_private_key(65537, 1024).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert "1024-bit" in key_strength_problem("RS256", base64.b64encode(der).decode())
    assert key_strength_problem("DSA", None)
    assert key_strength_problem("Ed25519", None) is None
