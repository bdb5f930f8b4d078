"""What the spawner loads before it forks supervisors (spawner.load_what_supervisors_run): whatever a
supervisor, its stage or its kernel-audit reader would load after the fork is copied into every
session's private memory, so they must find it loaded; and the throwaway audit log the spawner
warms the writer on leaves nothing behind, no thread (it forks) and no file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from enforcer.audit.keys import load_or_create

SCRIPT = r"""
import json, os, sys, tempfile, threading
from pathlib import Path

scratch, audit = Path(sys.argv[1]), Path(sys.argv[2])
tempfile.tempdir = str(scratch)  # where the spawner's throwaway log goes: checked below

from enforcer.daemon import spawner

spawner.load_what_supervisors_run()
loaded = set(sys.modules)
left = sorted(os.listdir(scratch))
threads = threading.active_count()

# What a supervisor runs after the fork: its audit writer on the daemon's log (a new one, then one
# to continue), a kernel denial explained, and its stage reading its pid in the session.
from enforcer.audit import AuditWriter, Entry, WriterSettings, records
from enforcer.policy.grants import explain_seccomp
from enforcer.sandbox import pidns

for _ in range(2):
    settings = WriterSettings(group_ms=5, group_records=64)
    writer = AuditWriter(audit / "log", audit / "key.pem", source="adl-enforcerd", settings=settings)
    receipt = writer.append(records.LAUNCH, {"argv": ["true"]}, corr="s-1")
    writer.sync(receipt.seq)
    writer.append_many([Entry(records.EXIT, {"exit_code": 0}, "s-1")], sync=True)
    writer.close()
explain_seccomp("ptrace")
pidns.host_pid()
print(json.dumps({"left": left, "threads": threads, "imported_after": sorted(set(sys.modules) - loaded)}))
"""


def test_a_supervisor_imports_nothing_after_the_fork_and_the_warm_up_leaves_nothing(tmp_path: Path) -> None:
    scratch, audit = tmp_path / "scratch", tmp_path / "audit"
    scratch.mkdir()
    audit.mkdir()
    load_or_create(audit / "key.pem")  # the daemon's key exists before any supervisor runs
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(scratch), str(audit)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)
    assert reported["imported_after"] == []
    assert reported["left"] == []  # the throwaway key and log are gone
    assert reported["threads"] == 1  # the throwaway writer's flusher is gone before any fork


def test_a_warm_up_that_cannot_write_is_reported_and_the_spawner_starts(tmp_path: Path) -> None:
    """Only memory depends on the warm-up: a temporary directory that cannot be made (a full or
    missing /tmp) is said on stderr, and the spawner loads the rest and serves."""
    script = (
        "import sys, tempfile, threading\n"
        f"tempfile.tempdir = {str(tmp_path / 'missing')!r}\n"
        "from enforcer.daemon import spawner\n"
        "spawner.load_what_supervisors_run()\n"
        "assert 'enforcer.policy.grants' in sys.modules and threading.active_count() == 1\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "the audit writer's first use failed" in result.stderr
