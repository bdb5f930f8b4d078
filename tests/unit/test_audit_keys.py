"""The audit signing key: concurrent first starts agree on one whole key; reading it back."""

from __future__ import annotations

import base64
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from enforcer.audit import keys

STARTS = 4
ROUNDS = 30


def _start(path: str, barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    barrier.wait()
    try:
        results.put(keys.raw_public(keys.load_or_create(Path(path)).public_key()).hex())
    except Exception as exc:
        results.put(f"error: {exc}")


def test_concurrent_first_starts_all_read_the_same_whole_key(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        path = tmp_path / f"r{round_}" / "audit-signing-key.pem"
        barrier, results = context.Barrier(STARTS), context.Queue()
        starts = [context.Process(target=_start, args=(str(path), barrier, results)) for _ in range(STARTS)]
        for start in starts:
            start.start()
        seen = [results.get(timeout=30) for _ in starts]
        for start in starts:
            start.join(timeout=30)
        assert len(set(seen)) == 1 and not seen[0].startswith("error"), (round_, seen)
        assert keys.raw_public(keys.load_public(keys.public_path(path))).hex() == seen[0]
        assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left
        assert path.stat().st_mode & 0o777 == 0o600


def test_an_existing_key_is_read_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "audit-signing-key.pem"
    first = keys.load_or_create(path)
    before = path.read_bytes()
    again = keys.load_or_create(path)
    assert path.read_bytes() == before
    assert keys.raw_public(first.public_key()) == keys.raw_public(again.public_key())
    assert os.stat(path).st_nlink == 1


LOAD_KEY = """
import sys
from pathlib import Path
from enforcer.audit import keys
key = keys.load_or_create(Path(sys.argv[1]))
print(keys.raw_public(key.public_key()).hex())
print("cryptography.hazmat.primitives.serialization" in sys.modules)
"""


def test_a_key_as_written_is_read_without_the_serialization_package(tmp_path: Path) -> None:
    """Every audit writer (every launch) loads the key: the form load_or_create writes is read
    directly, and reads as the same key cryptography's loader gives."""
    from cryptography.hazmat.primitives import serialization

    path = tmp_path / "key.pem"
    created = keys.raw_public(keys.load_or_create(path).public_key()).hex()
    proc = subprocess.run([sys.executable, "-c", LOAD_KEY, str(path)], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == [created, "False"]
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(loaded, ed25519.Ed25519PrivateKey)
    assert keys.raw_public(loaded.public_key()).hex() == created


def test_other_spellings_of_a_key_go_through_the_full_loader(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    expected = keys.raw_public(key.public_key())
    path = tmp_path / "key.pem"
    for spelling in (pem.replace(b"\n", b"\r\n"), b"a comment\n" + pem, pem.rstrip(b"\n")):
        path.write_bytes(spelling)
        assert keys._written_seed(spelling) is None
        assert keys.raw_public(keys.load_or_create(path).public_key()) == expected
    # Still refused: a PEM that is no key, a key of another type, a seed under another algorithm's OID.
    body = pem.split(b"\n")[1]
    der = base64.b64decode(body)
    x25519 = base64.b64encode(der.replace(bytes.fromhex("06032b6570"), bytes.fromhex("06032b656e")))
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for bad in (pem.replace(body, b"!" * 64), pem.replace(body, x25519), ec_pem, b"-----BEGIN PRIVATE KEY-----\n"):
        path.write_bytes(bad)
        assert keys._written_seed(bad) is None
        with pytest.raises(keys.AuditKeyError):
            keys.load_or_create(path)
