"""The agent never holds host root: metadata Landlock cannot see (mode bits, setuid, owner, times,
xattrs, POSIX ACLs) stays out of reach on the host's files, and root without an identity is refused."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import subprocess
import sys
import textwrap

from ..helpers.daemon import RunningDaemon
from ..helpers.sandbox import AGENT_UID, Result, Sandbox, needs_root

pytestmark = needs_root


def attempt(box: Sandbox, code: str, **kw: object) -> Result:
    result = box.python(textwrap.dedent(code), **kw)  # type: ignore[arg-type]
    assert "launch" in result.kinds() and "exit" in result.kinds(), result.err
    return result


def _acl_granting(uid: int) -> bytes:
    """A system.posix_acl_access value giving `uid` rwx (what setfacl -m u:UID:rwx writes)."""
    header = struct.pack("<I", 2)
    entries = [
        (0x01, 7, 0xFFFFFFFF),
        (0x02, 7, uid),
        (0x04, 4, 0xFFFFFFFF),
        (0x10, 7, 0xFFFFFFFF),
        (0x20, 4, 0xFFFFFFFF),
    ]
    return header + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


def test_host_files_metadata_is_out_of_reach(sandbox: Sandbox) -> None:
    """setuid bit on a root-owned binary, chmod of a 0600 root file, chown to self, utimes, a user
    xattr and a POSIX ACL on root-owned inodes: each must fail and leave the inode as it was."""
    tool = sandbox.outside / "tool"
    shutil.copy("/usr/bin/true", tool)
    tool.chmod(0o755)
    private = sandbox.outside / "root-only.txt"
    private.write_text("ROOT-ONLY\n")
    private.chmod(0o600)
    before = {p: os.stat(p) for p in (tool, private)}
    xattrs_before = {p: os.listxattr(p) for p in (tool, private)}
    result = attempt(
        sandbox,
        f"""
        import os
        def check(label, fn):
            try:
                fn()
                print("ESCAPED", label)
            except OSError as exc:
                print("BLOCKED", label, exc.errno)
        tool, private = {str(tool)!r}, {str(private)!r}
        check("setuid", lambda: os.chmod(tool, 0o4755))
        check("chmod", lambda: os.chmod(private, 0o644))
        check("chown", lambda: os.chown(private, os.getuid(), os.getgid()))
        check("utime", lambda: os.utime(private, (0, 0)))
        check("xattr", lambda: os.setxattr(private, "user.agent", b"x"))
        check("acl", lambda: os.setxattr(tool, "system.posix_acl_access", {_acl_granting(AGENT_UID)!r}))
        """,
    )
    assert result.out.count("BLOCKED") == 6 and "ESCAPED" not in result.out, result.out + result.err
    errnos = {int(line.split()[-1]) for line in result.out.splitlines() if line.startswith("BLOCKED")}
    # Refused for want of ownership (not unreachable); seccomp refuses xattr calls first (EOPNOTSUPP).
    assert errnos <= {errno.EPERM, errno.EACCES, errno.EOPNOTSUPP}, result.out
    for path, st in before.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_uid, now.st_gid, now.st_mtime_ns) == (
            st.st_mode,
            st.st_uid,
            st.st_gid,
            st.st_mtime_ns,
        )
        assert os.listxattr(path) == xattrs_before[path]
    assert not os.stat(tool).st_mode & stat.S_ISUID


def test_control_the_agent_still_works_in_its_workspace(sandbox: Sandbox) -> None:
    """Allowed commands run, the workspace is writable and its files' modes are the agent's to set,
    and python loads its C extensions."""
    ws = str(sandbox.ws)
    result = attempt(
        sandbox,
        f"""
        import os, subprocess, _ctypes, _decimal, _json, _socket, _ssl, zlib
        open({ws!r} + "/made.txt", "w").write("made")
        os.chmod({ws!r} + "/made.txt", 0o600)
        os.chmod({ws!r} + "/notes.txt", 0o640)
        os.utime({ws!r} + "/notes.txt", (0, 0))
        out = subprocess.run(["cat", {ws!r} + "/made.txt"], capture_output=True, text=True).stdout
        print("uid", os.getuid(), os.getgid(), os.getgroups(), "cat", out, zlib.crc32(b"x"))
        print(open("/proc/self/status").read())
        """,
    )
    assert result.code == 0, result.err
    assert f"uid {AGENT_UID} {AGENT_UID} [] cat made" in result.out, result.out
    assert stat.S_IMODE(os.stat(sandbox.ws / "made.txt").st_mode) == 0o600
    assert (sandbox.ws / "made.txt").stat().st_uid == AGENT_UID
    status = dict(line.split(":", 1) for line in result.out.splitlines() if ":" in line)
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"].strip() == "1"
    assert result.record("launch")["payload"]["uid"] == AGENT_UID


def test_root_without_an_identity_is_refused(sandbox: Sandbox) -> None:
    sandbox.user = None
    refused = sandbox.run("cat", str(sandbox.ws / "notes.txt"))
    assert refused.code == 125 and "never runs as host root" in refused.err and "--user" in refused.err
    assert "workspace notes" not in refused.out
    assert "refused" in refused.kinds() and "launch" not in refused.kinds()
    for spec in ("root", "0", "0:0", f"{AGENT_UID}:0", "no-such-user-here", "123456789"):
        r = sandbox.run("cat", str(sandbox.ws / "notes.txt"), args=("--user", spec))
        assert r.code == 125 and "workspace notes" not in r.out, (spec, r.err)


def test_the_sudo_caller_is_the_identity(sandbox: Sandbox) -> None:
    sandbox.user = None
    r = sandbox.python(
        "import os; print(os.getresuid(), os.getresgid())", env={"SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}
    )
    assert (
        r.code == 0
        and r.out.strip() == f"({AGENT_UID}, {AGENT_UID}, {AGENT_UID}) ({AGENT_UID}, {AGENT_UID}, {AGENT_UID})"
    )
    root_sudo = sandbox.python("print('ran')", env={"SUDO_UID": "0", "SUDO_GID": "0"})
    assert root_sudo.code == 125 and "ran" not in root_sudo.out


def test_the_daemon_refuses_a_root_caller(daemon: RunningDaemon) -> None:
    argv = daemon.exec_argv("cat", str(daemon.box.ws / "notes.txt"))
    as_root = argv[argv.index(sys.executable) :]  # without the switch to the test identity
    r = subprocess.run(as_root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 125 and "never runs as host root" in r.stderr, r.stderr
    assert "workspace notes" not in r.stdout
    ok = daemon.adl_exec("python3", "-c", "import os; print(os.getuid(), os.getpid())")
    assert ok.returncode == 0 and ok.stdout.split() == [str(AGENT_UID), "2"], ok.stderr  # its own PID namespace
    kinds = [r["intent"].rsplit(".", 1)[-1] for r in daemon.records()]
    assert kinds.count("refused") == 1 and kinds.count("launch") == 1
