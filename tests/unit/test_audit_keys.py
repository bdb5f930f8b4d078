"""The audit signing key's first creation: concurrent first starts agree on one whole key."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

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
