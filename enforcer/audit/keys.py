"""The Ed25519 key that seals the audit log (checkpoints, the signed head, session evidence)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from ..paths import make_private_dir
from .logfiles import sync_directory

# A key written by load_or_create, byte for byte: PKCS#8 (RFC 8410) holding only the 32-byte seed.
# Read directly, since cryptography's serialization package (SSH, ciphers) costs a launch more to
# import than signing does; any other PEM goes through cryptography's full loader.
_PEM_HEAD, _PEM_TAIL = b"-----BEGIN PRIVATE KEY-----\n", b"\n-----END PRIVATE KEY-----\n"
_PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")


class AuditKeyError(Exception):
    """The signing key cannot be read or created."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_path(private_path: Path) -> Path:
    return private_path.with_name(private_path.name.removesuffix(".pem") + ".pub.pem")


def load_or_create(path: Path) -> ed25519.Ed25519PrivateKey:
    """Read the private key; on first start create it (0600, O_EXCL so concurrent starts agree) and
    write the public half beside it for verifiers."""
    # Whoever else could write the key's directory could put a key of their own in its place and
    # re-seal a log they edited: checked (before anything is created) as the log's directory is.
    make_private_dir(path.parent, 0o700)
    try:
        return _load_private(path)
    except FileNotFoundError:
        pass
    import tempfile  # creating a key happens once per key file

    from cryptography.hazmat.primitives import serialization

    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    # Written whole under a temporary name, then linked into place: a concurrent start never reads
    # a half-written key, a crash never leaves an empty one, and link() fails if another start won.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return _load_private(path)
    finally:
        os.unlink(temporary)
    sync_directory(path.parent)
    public = public_path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{public.name}.")
    with os.fdopen(fd, "wb") as out:
        out.write(public_pem(key.public_key()))
    os.chmod(temporary, 0o644)
    os.replace(temporary, public)
    return key


def _load_private(path: Path) -> ed25519.Ed25519PrivateKey:
    data = path.read_bytes()
    if (seed := _written_seed(data)) is not None:
        return ed25519.Ed25519PrivateKey.from_private_bytes(seed)
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise AuditKeyError(f"{path}: not a PEM private key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise AuditKeyError(f"{path}: the audit key must be Ed25519")
    return key


def _written_seed(data: bytes) -> bytes | None:
    """The seed of a key in exactly the form load_or_create writes, else None."""
    body = data[len(_PEM_HEAD) : -len(_PEM_TAIL)]
    if len(body) != 64 or not data.startswith(_PEM_HEAD) or not data.endswith(_PEM_TAIL):
        return None
    try:
        der = base64.b64decode(body, validate=True)
    except ValueError:
        return None
    if len(der) != 48 or not der.startswith(_PKCS8_ED25519) or base64.b64encode(der) != body:
        return None
    return der[len(_PKCS8_ED25519) :]


def public_pem(key: ed25519.Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def raw_public(key: ed25519.Ed25519PublicKey) -> bytes:
    return key.public_bytes_raw()


def key_id(key: ed25519.Ed25519PublicKey) -> str:
    return "sha256:" + hashlib.sha256(raw_public(key)).hexdigest()[:32]


def load_public(path: Path) -> ed25519.Ed25519PublicKey:
    """A public key from a PEM file; a private key file is accepted too (its public half is used)."""
    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        return _load_private(path).public_key()
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(data)
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise AuditKeyError(f"{path}: not an Ed25519 public key")
    return key


def public_from_raw(text: str) -> ed25519.Ed25519PublicKey:
    return ed25519.Ed25519PublicKey.from_public_bytes(unb64url(text))


def signature_ok(key: ed25519.Ed25519PublicKey, signature: str, message: bytes) -> bool:
    if not isinstance(signature, str):  # read from a file that may have been edited
        return False
    try:
        key.verify(unb64url(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True
