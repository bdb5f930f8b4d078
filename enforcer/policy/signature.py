"""Attestation signatures: JCS (RFC 8785) without the signature object, key from the document.

Verification follows ADL §10: remove `security.attestation.signature`, canonicalise with JCS,
check the digest in digest mode, resolve the public key from `cryptographic_identity.public_key`,
verify. Only the algorithms the draft lists are accepted; anything else is ADL-4001.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
from typing import Any, Literal

import rfc8785
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ..quick_dataclass import dataclass
from .errors import Finding
from .jsonvalues import obj

SignatureState = Literal["absent", "verified", "invalid"]

_STRONG = {"ed25519", "ed448", "eddsa", "es256", "es384", "es512", "rs256", "ps256"}
_CURVE_FOR = {"es256": ec.SECP256R1, "es384": ec.SECP384R1, "es512": ec.SECP521R1}
_HASH_FOR: dict[str, type[hashes.HashAlgorithm]] = {
    "es256": hashes.SHA256,
    "es384": hashes.SHA384,
    "es512": hashes.SHA512,
}
_DIGESTS = {
    "sha-256": hashlib.sha256,
    "sha256": hashlib.sha256,
    "sha-384": hashlib.sha384,
    "sha384": hashlib.sha384,
    "sha-512": hashlib.sha512,
    "sha512": hashlib.sha512,
}
_PUBKEY_PTR = "/cryptographic_identity/public_key"
_SIG_PTR = "/security/attestation/signature"


@dataclass(frozen=True)
class SignatureResult:
    state: SignatureState
    findings: tuple[Finding, ...]
    algorithm: str | None = None


def _b64(value: str) -> bytes:
    """Accept base64 and base64url, padded or not."""
    text = value.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    return base64.b64decode(text, validate=True)


def canonical_signed_bytes(document: dict[str, Any]) -> bytes:
    unsigned = copy.deepcopy(document)
    attestation = unsigned.get("security", {}).get("attestation", {})
    if isinstance(attestation, dict):
        attestation.pop("signature", None)
    return rfc8785.dumps(unsigned)


def _load_public_key(algorithm: str, raw: bytes) -> Any:
    alg = algorithm.lower()
    if alg in ("ed25519", "eddsa") and len(raw) == 32:
        return ed25519.Ed25519PublicKey.from_public_bytes(raw)
    if alg == "ed448" and len(raw) == 57:
        return ed448.Ed448PublicKey.from_public_bytes(raw)
    if raw.startswith(b"-----BEGIN"):
        return serialization.load_pem_public_key(raw)
    return serialization.load_der_public_key(raw)


def key_strength_problem(algorithm: object, key_value: object) -> str | None:
    """Why the declared key is too weak or unusable, or None when it meets the draft's minimum."""
    if not isinstance(algorithm, str):
        return "algorithm is missing"
    alg = algorithm.lower()
    if alg not in _STRONG:
        return f"algorithm {algorithm!r} is not an accepted signature algorithm (use Ed25519)"
    if not isinstance(key_value, str):
        return None
    try:
        key = _load_public_key(alg, _b64(key_value))
    except (ValueError, binascii.Error, UnsupportedAlgorithm):
        # An undecodable key is not a weak one; it fails at signature verification (ADL-4002).
        return None
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        return f"algorithm {algorithm!r} with {key.key_size}-bit key is below the 2048-bit minimum"
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.key_size < 256:
        return f"ECDSA key on {key.curve.name} is below P-256"
    return None


def verify(document: dict[str, Any]) -> SignatureResult:
    """Verify the document's attestation signature, if it claims one."""
    signature = obj(obj(document.get("security")).get("attestation")).get("signature")
    if signature is None:
        return SignatureResult("absent", ())
    if not isinstance(signature, dict):
        return _invalid("signature is not an object")
    algorithm = signature.get("algorithm")
    problem = key_strength_problem(algorithm, None)
    if problem:
        return SignatureResult("invalid", (Finding("ADL-4001", problem, _SIG_PTR + "/algorithm"),))
    public_key = obj(document.get("cryptographic_identity")).get("public_key")
    if not isinstance(public_key, dict) or not isinstance(public_key.get("value"), str):
        return _invalid("no cryptographic_identity.public_key to verify the signature with")
    key_alg = public_key.get("algorithm")
    if isinstance(key_alg, str) and isinstance(algorithm, str) and not _compatible(key_alg, algorithm):
        return _invalid(f"signature algorithm {algorithm!r} does not match key algorithm {key_alg!r}")
    try:
        key = _load_public_key(str(algorithm), _b64(public_key["value"]))
        sig = _b64(str(signature.get("value", "")))
    except (ValueError, binascii.Error, UnsupportedAlgorithm) as exc:
        return _invalid(f"cannot decode key or signature: {exc}")
    try:
        message = canonical_signed_bytes(document)
    except (TypeError, ValueError, rfc8785.CanonicalizationError) as exc:
        return _invalid(f"document cannot be canonicalised: {exc}")
    candidates = [message]
    if signature.get("signed_content") == "digest":
        digest_fn = _DIGESTS.get(str(signature.get("digest_algorithm", "")).lower())
        if digest_fn is None:
            return SignatureResult(
                "invalid",
                (
                    Finding(
                        "ADL-4001",
                        f"digest algorithm {signature.get('digest_algorithm')!r} is not accepted",
                        _SIG_PTR + "/digest_algorithm",
                    ),
                ),
            )
        digest = digest_fn(message).digest()
        try:
            declared = _b64(str(signature.get("digest_value", "")))
        except (ValueError, binascii.Error):
            declared = b""
        if declared != digest and str(signature.get("digest_value", "")).lower() != digest.hex():
            return _invalid("digest_value does not match the canonical document")
        candidates = [digest, message]
    for candidate in candidates:
        if _verify_with(key, str(algorithm).lower(), sig, candidate):
            return SignatureResult("verified", (), str(algorithm))
    return _invalid("signature does not verify against the canonical document and declared key")


def _compatible(key_alg: str, sig_alg: str) -> bool:
    a, b = key_alg.lower(), sig_alg.lower()
    eddsa = {"ed25519", "eddsa"}
    return a == b or (a in eddsa and b in eddsa)


def _verify_with(key: Any, alg: str, sig: bytes, message: bytes) -> bool:
    try:
        if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            key.verify(sig, message)
        elif isinstance(key, ec.EllipticCurvePublicKey) and alg in _CURVE_FOR:
            if not isinstance(key.curve, _CURVE_FOR[alg]):
                return False
            half = len(sig) // 2  # JOSE signatures are raw r||s
            der = encode_dss_signature(int.from_bytes(sig[:half], "big"), int.from_bytes(sig[half:], "big"))
            key.verify(der, message, ec.ECDSA(_HASH_FOR[alg]()))
        elif isinstance(key, rsa.RSAPublicKey) and alg == "rs256":
            key.verify(sig, message, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, rsa.RSAPublicKey) and alg == "ps256":
            key.verify(sig, message, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


def _invalid(detail: str) -> SignatureResult:
    return SignatureResult("invalid", (Finding("ADL-4002", detail, _SIG_PTR),))


def sign_ed25519(document: dict[str, Any], private_key: ed25519.Ed25519PrivateKey) -> dict[str, Any]:
    """Return a copy of `document` carrying a canonical-mode Ed25519 signature (tests, examples)."""
    signed = copy.deepcopy(document)
    raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    signed.setdefault("cryptographic_identity", {})["public_key"] = {
        "algorithm": "Ed25519",
        "value": base64.b64encode(raw).decode(),
    }
    attestation = signed.setdefault("security", {}).setdefault("attestation", {"type": "self"})
    attestation.pop("signature", None)
    value = private_key.sign(rfc8785.dumps(signed))
    attestation["signature"] = {
        "algorithm": "Ed25519",
        "value": base64.urlsafe_b64encode(value).rstrip(b"=").decode(),
        "signed_content": "canonical",
    }
    return signed
