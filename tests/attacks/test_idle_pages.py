"""A launcher's extension-module pages dropped while it waits (enforcer/sandbox/idle_pages.py):
only mappings whose content nothing can have written nor can move, and the code in them still runs
after (the session's end signs with cryptography's module)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from enforcer.audit import keys
from enforcer.audit.evidence import evidence_problem
from enforcer.audit.verify import verify_directory
from enforcer.sandbox import idle_pages

from ..helpers.sandbox import Sandbox, needs_root

SMAPS = """\
7f0000000000-7f0000010000 r--p 00000000 08:01 11 /lib/ext.so
Rss:                  64 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
7f0000010000-7f0000030000 r-xp 00010000 08:01 11 /lib/ext.so
Rss:                 128 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
7f0000030000-7f0000032000 r--p 00030000 08:01 11 /lib/ext.so
Rss:                   8 kB
Anonymous:             8 kB
VmFlags: rd mr mw me ac
7f0000032000-7f0000034000 rw-p 00032000 08:01 11 /lib/ext.so
Rss:                   8 kB
Anonymous:             0 kB
VmFlags: rd wr mr mw me ac
7f0000040000-7f0000050000 r-xp 00000000 08:01 12 /lib/other lib.so
Rss:                  64 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
7f0000060000-7f0000070000 r--p 00000000 08:01 13 /etc/ld.so.cache
Rss:                  64 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
7f0000070000-7f0000080000 rw-p 00000000 00:00 0
Rss:                  64 kB
Anonymous:            64 kB
VmFlags: rd wr mr mw me ac
"""


def test_only_clean_read_only_mappings_of_loaded_modules_are_released() -> None:
    """Not the written RELRO page (its relocations would be lost), not a writable mapping, not a
    file no loaded module maps (ld.so.cache, mapped during a dlopen, can be unmapped and its
    address reused by another thread meanwhile), not anonymous memory."""
    found = idle_pages.releasable(SMAPS, {"/lib/ext.so", "/lib/other lib.so"})
    assert found == [(0x7F0000000000, 0x10000), (0x7F0000010000, 0x20000), (0x7F0000040000, 0x10000)]
    assert idle_pages.releasable(SMAPS, set()) == []


PROBE = textwrap.dedent(
    """
    import sys
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from enforcer.sandbox import idle_pages

    def rust_rss_kib():
        total, ours = 0, False
        for line in open("/proc/self/smaps"):
            fields = line.split()
            if not fields[0].endswith(":"):
                ours = len(fields) > 5 and fields[5].endswith("_rust.abi3.so")
            elif fields[0] == "Rss:" and ours:
                total += int(fields[1])
        return total

    key = ed25519.Ed25519PrivateKey.generate()
    key.public_key().verify(key.sign(b"before"), b"before")
    before = rust_rss_kib()
    released = idle_pages.release()
    after = rust_rss_kib()
    signature = key.sign(b"after")  # the module's code, faulted back in
    key.public_key().verify(signature, b"after")
    print(before, after, released)
    """
)


def test_a_released_module_still_runs_and_holds_fewer_pages() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    before, after, released = (int(x) for x in run.stdout.split())
    assert released > 0 and after < before / 2, run.stdout


@needs_root
def test_a_session_past_the_delay_ends_with_valid_signatures(sandbox: Sandbox) -> None:
    """adl-exec releases once the session has run RELEASE_AFTER_S; the session's end then signs its
    evidence and the log's checkpoint with the released module: both verify."""
    started = time.monotonic()
    r = sandbox.python(f"import time; time.sleep({idle_pages.RELEASE_AFTER_S + 0.5})")
    assert r.code == 0 and time.monotonic() - started > idle_pages.RELEASE_AFTER_S, r.err
    public = keys.load_public(keys.public_path(Path(sandbox.environ()["ADL_ENFORCER_AUDIT_KEY"])))
    assert evidence_problem(r.record("session.evidence")["payload"]["evidence"], public) is None
    report = verify_directory(sandbox.audit, public)
    assert report.intact, report.problem


@needs_root
def test_adl_exec_maps_fewer_module_pages_once_the_session_has_run_a_while(sandbox: Sandbox) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enforcer.cli.exec",
            "--adl",
            str(sandbox.policy()),
            "--user",
            sandbox.user or "",
            "--",
            "python3",
            "-c",
            f"import time; time.sleep({idle_pages.RELEASE_AFTER_S + 2})",
        ],
        env=sandbox.environ(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(idle_pages.RELEASE_AFTER_S / 2)
        early = _rust_rss_kib(proc.pid)
        time.sleep(idle_pages.RELEASE_AFTER_S + 0.5)
        late = _rust_rss_kib(proc.pid)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert early > 1024 and late < early / 2, (early, late)


def _rust_rss_kib(pid: int) -> int:
    total, ours = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):
            ours = len(fields) > 5 and fields[5].endswith("_rust.abi3.so")
        elif fields[0] == "Rss:" and ours:
            total += int(fields[1])
    return total


@needs_root
def test_the_release_does_not_move_the_sessions_deadline(sandbox: Sandbox) -> None:
    """The wait is split at RELEASE_AFTER_S: the session is still killed at max_duration_sec from
    its start, not that much after the release."""
    limit = 2
    assert limit > idle_pages.RELEASE_AFTER_S
    policy = sandbox.policy(permissions={**sandbox.permissions, "resource_limits": {"max_duration_sec": limit}})
    r = sandbox.python("import time; time.sleep(30)", policy=policy)
    exit_record = r.record("exit")["payload"]
    assert exit_record["reason"] == "timeout", r.err
    assert limit * 1000 <= exit_record["duration_ms"] < limit * 1000 + 500, exit_record


def test_only_an_embedded_launch_without_egress_releases() -> None:
    """An egress filter (a fork of adl-exec) and a daemon session's supervisor (a fork of the
    spawner) share these pages: releasing them there would leave them to the other process."""
    import socket

    from enforcer.sandbox import launcher
    from enforcer.sandbox.stage import Guardian, ParentWatches

    ours, theirs = socket.socketpair()
    try:
        assert launcher.releases_idle_pages(Guardian(0, ours), None)
        assert not launcher.releases_idle_pages(Guardian(0, ours), theirs.fileno())
        assert not launcher.releases_idle_pages(ParentWatches(), None)
    finally:
        ours.close()
        theirs.close()


def test_a_release_that_cannot_read_its_mappings_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of descriptors (or without /proc) while the session runs: the session is not failed for
    a memory saving."""
    import builtins

    real_open = builtins.open

    def no_smaps(path: object, *args: object, **kw: object) -> object:
        if path == "/proc/self/smaps":
            raise OSError(24, "Too many open files")
        return real_open(path, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", no_smaps)
    assert idle_pages.release() == 0
