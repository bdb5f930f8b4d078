"""Hostile-agent attacks on the creation guard, the execution layer, the runtime baseline and the
metadata calls Landlock cannot see. Each tries the forbidden thing from inside a real sandbox, and a
control shows the allowed thing next to it still works. None depends on the agent being root."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ..helpers.sandbox import AGENT_USER, PROBE_CHECK, Result, Sandbox, needs_root

pytestmark = needs_root

TRY = (
    PROBE_CHECK
    + """
def works(label, fn):
    try:
        fn()
        print("WORKS", label)
    except OSError as exc:
        print("BROKEN", label, exc)
"""
)


def run(box: Sandbox, code: str, **kw: Any) -> Result:
    result = box.python(TRY + textwrap.dedent(code), **kw)
    assert "launch" in result.kinds() and "exit" in result.kinds(), result.err
    return result


def outcome(result: Result, blocked: int, works: int = 0) -> None:
    text = result.out + result.err
    assert "ESCAPED" not in result.out and "BROKEN" not in result.out, text
    assert result.out.count("BLOCKED") == blocked and result.out.count("WORKS") == works, text


# -- the creation guard -----------------------------------------------------------------------------


def test_the_guard_never_reopens_a_file_with_wider_rights(sandbox: Sandbox) -> None:
    """An O_PATH descriptor needs no rights; asking the guard to reopen it through /proc/self/fd/N
    (O_CREAT sends the call to the guard) must grant only what the agent could open itself."""
    ws = str(sandbox.ws)
    result = run(
        sandbox,
        f"""
def via_guard(path):
    fd = os.open(path, os.O_PATH)
    data = os.read(os.open(f"/proc/self/fd/{{fd}}", os.O_RDONLY | os.O_CREAT, 0o600), 4096)
    if not data: raise OSError(errno.ENODATA, "empty")
check("direct /proc/version", lambda: open("/proc/version").read())
check("/proc/version via the guard", lambda: via_guard("/proc/version"))
check("/proc/cpuinfo via the guard", lambda: via_guard("/proc/cpuinfo"))
check("outside file via the guard", lambda: via_guard({str(sandbox.outside / "private.txt")!r}))
def parent_environ():
    for pid in range(max(2, os.getpid() - 30), os.getpid() + 30):
        try:
            fd = os.open(f"/proc/{{pid}}/environ", os.O_PATH)
            data = os.read(os.open(f"/proc/self/fd/{{fd}}", os.O_RDONLY | os.O_CREAT), 65536)
        except OSError:
            continue
        if b"DROPPED_SECRET" in data: return
    raise OSError(errno.EACCES, "no environment readable")
check("another process's environ via the guard", parent_environ)
works("workspace file via the guard", lambda: via_guard({ws + "/notes.txt"!r}))
def own_descriptor():
    fd = os.open({ws + "/own.txt"!r}, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(os.open(f"/proc/self/fd/{{fd}}", os.O_WRONLY | os.O_CREAT | os.O_APPEND), b"through-own-fd\\n")
works("the agent's own descriptor reopened through the guard", own_descriptor)
""",
        env={"DROPPED_SECRET": "leak"},
    )
    outcome(result, blocked=5, works=2)
    assert (sandbox.ws / "own.txt").read_text() == "through-own-fd\n"


def test_the_guard_holds_no_environment(sandbox: Sandbox) -> None:
    """Seen from the host: the guard process's /proc environ holds nothing of adl-exec's."""
    policy = sandbox.policy()
    ready = sandbox.ws / "ready"
    import subprocess
    import sys

    environ = {
        **os.environ,
        "ADL_ENFORCER_AUDIT_DIR": str(sandbox.audit),
        "ADL_ENFORCER_AUDIT_KEY": str(sandbox.root / "audit-key.pem"),
        "GUARD_ENV_MARKER": "marker-value",
    }
    code = f"import time; open({str(ready)!r}, 'w').close(); time.sleep(3)"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enforcer.cli.exec",
            "--adl",
            str(policy),
            "--user",
            AGENT_USER,
            "--",
            "python3",
            "-c",
            code,
        ],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        guards = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                status = Path(f"/proc/{pid}/status").read_text()
                env = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            # The guard: adl-exec's image, under Landlock (no_new_privs) but without a seccomp filter.
            if str(policy).encode() in cmdline and "NoNewPrivs:\t1" in status and "Seccomp:\t0" in status:
                guards.append(env)
        assert len(guards) == 1, guards
        assert b"GUARD_ENV_MARKER" not in guards[0] and b"marker-value" not in guards[0]
    finally:
        proc.wait(timeout=30)


@pytest.fixture
def dotdirs(sandbox: Sandbox) -> Sandbox:
    ssh = sandbox.ws / ".ssh"
    ssh.mkdir()
    (ssh / "authorized_keys").write_text("HOST-KEY\n")
    fs = sandbox.permissions["filesystem"]
    fs["denied_paths"] = [
        *fs["denied_paths"],
        f"{sandbox.root}/**/.aws/credentials",
        f"{sandbox.root}/**/.ssh/authorized_keys",
    ]
    return sandbox


RENAMEAT2 = """
def renameat2(old, new, flags):
    if libc.renameat2(-100, old.encode(), -100, new.encode(), flags) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
"""


def test_moving_a_directory_cannot_assemble_a_denied_name(dotdirs: Sandbox) -> None:
    ws = str(dotdirs.ws)
    result = run(
        dotdirs,
        RENAMEAT2
        + f"""
ws = {ws!r}
os.makedirs(ws + "/aws-tmp/deeper")
open(ws + "/aws-tmp/credentials", "w").write("agent")
check("rename aws-tmp to .aws", lambda: os.rename(ws + "/aws-tmp", ws + "/.aws"))
os.makedirs(ws + "/outer/aws-tmp")
open(ws + "/outer/aws-tmp/credentials", "w").write("agent")
os.rename(ws + "/outer/aws-tmp", ws + "/outer/.awsx")
check("rename a parent so a nested name matches", lambda: renameat2(ws + "/outer/.awsx", ws + "/outer/.aws", 0))
os.makedirs(ws + "/build-tmp/sub")
open(ws + "/build-tmp/sub/out.txt", "w").write("ok")
works("rename a harmless tree", lambda: os.rename(ws + "/build-tmp", ws + "/build"))
""",
    )
    outcome(result, blocked=2, works=1)
    assert not (dotdirs.ws / ".aws").exists() and not (dotdirs.ws / "outer/.aws").exists()
    assert (dotdirs.ws / "build/sub/out.txt").read_text() == "ok"
    guard = [r["payload"] for r in result.records if r["payload"].get("enforced_by", "").startswith("creation guard")]
    assert f"{ws}/.aws/credentials" in [d["path"] for d in guard], guard


def test_a_symbolic_link_cannot_alias_a_denied_directory_name(dotdirs: Sandbox) -> None:
    """`.aws -> aws-tmp` would make `.aws/credentials` resolve while the file itself is created, and
    checked, as `aws-tmp/credentials`."""
    ws = str(dotdirs.ws)
    result = run(
        dotdirs,
        f"""
ws = {ws!r}
os.mkdir(ws + "/aws-tmp")
open(ws + "/aws-tmp/credentials", "w").write("agent")
check("symlink .aws to a directory of the agent", lambda: os.symlink("aws-tmp", ws + "/.aws"))
os.symlink("aws-tmp", ws + "/link-a"); os.symlink("aws-tmp", ws + "/link-b")
check("hard link a symlink as .aws", lambda: os.link(ws + "/link-b", ws + "/.aws", follow_symlinks=False))
check("rename a symlink to .aws", lambda: os.rename(ws + "/link-a", ws + "/.aws"))
works("symlink with a harmless name", lambda: os.symlink("aws-tmp", ws + "/bin"))
""",
    )
    outcome(result, blocked=3, works=1)
    assert all(line.endswith(" 13") for line in result.out.splitlines() if line.startswith("BLOCKED"))  # EACCES
    assert not os.path.lexists(dotdirs.ws / ".aws")


def test_exchange_cannot_swap_a_masked_file(dotdirs: Sandbox) -> None:
    ws = str(dotdirs.ws)
    result = run(
        dotdirs,
        RENAMEAT2
        + f"""
ws = {ws!r}
os.mkdir(ws + "/mine")
open(ws + "/mine/authorized_keys", "w").write("AGENT-KEY")
check("exchange .ssh with the agent's directory", lambda: renameat2(ws + "/mine", ws + "/.ssh", 2))
check("exchange the other way round", lambda: renameat2(ws + "/.ssh", ws + "/mine", 2))
os.mkdir(ws + "/left"); os.mkdir(ws + "/right")
open(ws + "/left/a.txt", "w").write("a")
works("exchange two harmless directories", lambda: renameat2(ws + "/left", ws + "/right", 2))
""",
    )
    outcome(result, blocked=2, works=1)
    assert (dotdirs.ws / ".ssh/authorized_keys").read_text() == "HOST-KEY\n"
    assert (dotdirs.ws / "right/a.txt").exists()


# -- execution: only allowed programs and their libraries are mapped as code -------------------------

LOADER = "/lib64/ld-linux-x86-64.so.2" if os.uname().machine == "x86_64" else "/lib/ld-linux-aarch64.so.1"
LOADED = """
import subprocess
def loader(*argv):
    done = subprocess.run([{loader!r}, *argv], capture_output=True, timeout=20)
    if done.returncode != 0:
        raise OSError(errno.EACCES, done.stderr.decode()[-200:])
"""


def test_the_loader_cannot_run_programs_outside_allowed_commands(sandbox: Sandbox) -> None:
    ws = str(sandbox.ws)
    policy = sandbox.policy(
        permissions={
            "filesystem": {
                **sandbox.permissions["filesystem"],
                "allowed_paths": [
                    *sandbox.permissions["filesystem"]["allowed_paths"],
                    {"path": "/usr/bin/**", "access": "read"},
                ],
            }
        }
    )
    result = run(
        sandbox,
        LOADED.format(loader=LOADER)
        + f"""
ws = {ws!r}
check("ld.so git (not an allowed command)", lambda: loader("/usr/lib/git-core/git", "--version"))
check("ld.so bash -c (allow_shell false)", lambda: loader("/usr/bin/bash", "-c", "echo hi"))
open(ws + "/agent-elf", "wb").write(open("/usr/lib/git-core/git", "rb").read())
check("ld.so an ELF the agent wrote", lambda: loader(ws + "/agent-elf", "--version"))
import ctypes.util
open(ws + "/agent.so", "wb").write(open("/usr/lib/" + os.uname().machine + "-linux-gnu/libz.so.1", "rb").read())
check("dlopen of a library the agent wrote", lambda: ctypes.CDLL(ws + "/agent.so"))
works("an allowed command", lambda: subprocess.run(["ls", ws], check=True, capture_output=True))
works("the loader running an allowed command", lambda: loader("/usr/bin/cat", ws + "/notes.txt"))
def extensions():
    import _ctypes, _decimal, _json, _ssl, select, zlib, _sqlite3  # C extensions from lib-dynload
works("python imports C extensions", extensions)
""",
        policy=policy,
    )
    outcome(result, blocked=4, works=3)


@pytest.mark.skipif(not os.path.exists("/usr/bin/git"), reason="git is not installed")
def test_git_and_node_still_run_under_noexec_mounts(sandbox: Sandbox) -> None:
    """Control: real programs with their own libraries (git, node where installed) keep working."""
    ws = str(sandbox.ws)
    commands = ["python3", "git", *(["node"] if os.path.exists("/usr/bin/node") else [])]
    fs = sandbox.permissions["filesystem"]
    policy = sandbox.policy(
        permissions={
            "execution": {"allowed_commands": commands, "allow_shell": False},
            # node reads OpenSSL's configuration at start, which the runtime baseline does not grant
            "filesystem": {**fs, "allowed_paths": [*fs["allowed_paths"], {"path": "/etc/ssl/**", "access": "read"}]},
        }
    )
    result = run(
        sandbox,
        f"""
import subprocess
env = {{"GIT_CONFIG_NOSYSTEM": "1", "HOME": {ws!r}, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
       "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}}
def git(*args):
    subprocess.run(["git", "-C", {ws!r} + "/repo", *args], check=True, capture_output=True, env=env)
def repository():
    subprocess.run(["git", "init", "-q", {ws!r} + "/repo"], check=True, capture_output=True, env=env)
    open({ws!r} + "/repo/a.txt", "w").write("a")
    git("add", "a.txt")
    git("commit", "-q", "-m", "first")
    git("log", "--oneline")
works("git init, add, commit, log", repository)
if {"node" in commands!r}:
    def node():
        out = subprocess.run(["node", "-e", "console.log(6 * 7)"], check=True, capture_output=True).stdout
        if out.strip() != b"42": raise OSError(errno.EIO, out)
    works("node", node)
""",
        policy=policy,
    )
    outcome(result, blocked=0, works=len(commands) - 1)


# -- deny wins over the runtime baseline -------------------------------------------------------------


def test_a_denied_path_inside_the_runtime_baseline_is_masked(sandbox: Sandbox) -> None:
    fs = sandbox.permissions["filesystem"]
    policy = sandbox.policy(
        permissions={"filesystem": {**fs, "denied_paths": [*fs["denied_paths"], "/etc/passwd", "/usr/lib/os-rel*"]}}
    )
    result = run(
        sandbox,
        """
def read(path):
    data = open(path).read()
    if not data: raise OSError(errno.EACCES, "masked (empty)")
check("/etc/passwd (baseline, denied)", lambda: read("/etc/passwd"))
check("/usr/lib/os-release (beneath a baseline directory, denied)", lambda: read("/usr/lib/os-release"))
works("/etc/group (baseline, not denied)", lambda: read("/etc/group"))
""",
        policy=policy,
    )
    outcome(result, blocked=2, works=1)
    layers = {layer["name"]: layer for layer in result.record("launch")["payload"]["layers"]}
    assert any("/etc/passwd DENIED" in d for d in layers["filesystem"]["details"])
    # What stays open is stated, in --explain's layers and in the signed evidence.
    gaps = result.record("session.evidence")["payload"]["evidence"]["limits"]["not_enforced"]
    assert any(g.startswith("late host files") for g in gaps) and gaps == layers["not covered"]["details"]


# -- metadata calls Landlock cannot see, and MPTCP ----------------------------------------------------


@pytest.mark.parametrize("denied", [True, False], ids=["with-denied-patterns", "without"])
def test_metadata_changes_stay_inside_writable_grants(sandbox: Sandbox, denied: bool) -> None:
    """Landlock has no right for chmod, chown, utimes or xattrs: seccomp and the guard keep them to
    files beneath a writable grant, and refuse setuid/setgid bits and ACLs everywhere."""
    if not denied:
        sandbox.permissions["filesystem"]["denied_paths"] = []
    ws, ref, outside = str(sandbox.ws), str(sandbox.ref / "doc.txt"), str(sandbox.outside / "private.txt")
    before = {p: os.stat(p) for p in (ref, outside)}
    result = run(
        sandbox,
        f"""
ws, ref, outside = {ws!r}, {ref!r}, {outside!r}
check("chmod a read-only grant's file", lambda: os.chmod(ref, 0o666))
check("chmod a file outside every grant", lambda: os.chmod(outside, 0o644))
check("fchmodat through a directory descriptor", lambda: os.chmod("doc.txt", 0o600,
      dir_fd=os.open(os.path.dirname(ref), os.O_PATH)))
check("fchmod of an O_PATH-reopened descriptor", lambda: os.chmod(f"/proc/self/fd/{{os.open(ref, os.O_PATH)}}", 0o666))
check("utime a read-only grant's file", lambda: os.utime(ref, (0, 0)))
check("chown a file outside every grant (owner kept)", lambda: os.chown(outside, -1, os.getgid()))
open(ws + "/tool", "w").write("x")
check("setuid bit in the workspace", lambda: os.chmod(ws + "/tool", 0o4755))
check("setgid bit in the workspace", lambda: os.chmod(ws + "/tool", 0o2755))
check("user xattr in the workspace", lambda: os.setxattr(ws + "/tool", "user.mark", b"1"))
check("POSIX ACL on a read-only grant's file", lambda: os.setxattr(ref, "system.posix_acl_access",
      bytes.fromhex("02000000" "0100060000000000" "0400040000000000" "1000060000000000" "2000040000000000")))
works("chmod in the workspace", lambda: os.chmod(ws + "/tool", 0o750))
works("utime now through a descriptor", lambda: os.utime(os.open(ws + "/tool", os.O_RDONLY)))
works("utime in the workspace", lambda: os.utime(ws + "/tool", (1, 2)))
works("chown in the workspace (owner kept)", lambda: os.chown(ws + "/tool", -1, os.getgid()))
""",
    )
    outcome(result, blocked=10, works=4)
    for path, info in before.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_mtime_ns, now.st_uid, now.st_gid) == (
            info.st_mode,
            info.st_mtime_ns,
            info.st_uid,
            info.st_gid,
        ), path
    tool = os.stat(sandbox.ws / "tool")
    assert tool.st_mode & 0o7777 == 0o750 and tool.st_mtime == 2


def test_mptcp_sockets_cannot_listen(sandbox: Sandbox) -> None:
    result = run(
        sandbox,
        """
def listen(protocol):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, protocol)
    s.bind(("127.0.0.1", 0))
    s.listen()
check("MPTCP listen", lambda: listen(262))
check("MPTCP over IPv6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM, 262))
check("TCP listen (Landlock: no TCP bind)", lambda: listen(0))
works("a UDP socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).bind(("127.0.0.1", 0)))
""",
    )
    outcome(result, blocked=3, works=1)


def test_inotify_watches_only_what_the_agent_can_read(sandbox: Sandbox) -> None:
    """inotify events carry the names created in a watched directory; Landlock does not check watches."""
    ws, outside = str(sandbox.ws), str(sandbox.outside)
    result = run(
        sandbox,
        f"""
import struct
instance = libc.inotify_init1(0)
def watch(path, mask=0x100):  # IN_CREATE
    wd = libc.inotify_add_watch(instance, path.encode(), mask)
    if wd < 0: raise OSError(ctypes.get_errno(), "inotify_add_watch")
    return wd
check("watch a directory outside every grant", lambda: watch({outside!r}))
check("watch /etc (only some files granted)", lambda: watch("/etc"))
check("watch through /proc/self/root", lambda: watch("/proc/self/root" + {outside!r}))
check("fanotify", lambda: (_ for _ in ()).throw(OSError(ctypes.get_errno(), "fanotify"))
      if libc.syscall(300, 0xC00, 0) < 0 else None)  # FAN_REPORT_DFID_NAME (unprivileged)
def watch_workspace():
    watch({ws!r})
    open({ws!r} + "/seen.txt", "w").close()
    data = os.read(instance, 4096)
    if b"seen.txt" not in data: raise OSError(errno.EIO, "no event")
works("watch the workspace and see a new name", watch_workspace)
""",
    )
    outcome(result, blocked=4, works=1)


def test_a_launch_directory_inside_a_mask_does_not_bypass_it(sandbox: Sandbox) -> None:
    """The stage enters the caller's directory before the masks exist; a relative path from a
    launch directory inside a masked one must not reach the files beneath the mask."""
    import subprocess
    import sys

    vault = sandbox.ws / "vault"
    vault.mkdir()
    (vault / "key").write_text("VAULT-CONTENT\n")
    fs = sandbox.permissions["filesystem"]
    policy = sandbox.policy(permissions={"filesystem": {**fs, "denied_paths": [*fs["denied_paths"], f"{vault}/**"]}})
    environ = {
        **os.environ,
        "ADL_ENFORCER_AUDIT_DIR": str(sandbox.audit),
        "ADL_ENFORCER_AUDIT_KEY": str(sandbox.root / "audit-key.pem"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(policy), "--user", AGENT_USER, "--", "cat", "./key"],
        cwd=vault,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "VAULT-CONTENT" not in done.stdout and done.returncode != 0, done.stdout + done.stderr
    control = subprocess.run(
        [
            sys.executable,
            "-m",
            "enforcer.cli.exec",
            "--adl",
            str(policy),
            "--user",
            AGENT_USER,
            "--",
            "cat",
            "./notes.txt",
        ],
        cwd=sandbox.ws,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert control.returncode == 0 and control.stdout == "workspace notes\n", control.stderr


def test_the_agent_starts_with_no_child_and_the_guard_is_not_its_child(sandbox: Sandbox) -> None:
    """The guard is double-forked: the process between is collected before the agent's exec, so the
    agent inherits no child (a zombie it could wait for), and the guard is init's child, not the
    agent's (a child, live or dead, would be waited for here)."""
    code = (
        "import os\n"
        "try:\n    print('a child to wait for', os.waitpid(-1, os.WNOHANG))\n"
        "except ChildProcessError:\n    print('no child')\n"
    )
    for _ in range(3):
        result = sandbox.python(code)
        assert result.code == 0 and result.out.strip() == "no child", (result.out, result.err)
        assert "creation guard" in " ".join(str(layer) for layer in result.record("launch")["payload"]["layers"])
