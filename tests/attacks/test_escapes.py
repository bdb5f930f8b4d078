"""Escape attempts from inside a real sandbox. Each one must fail, and the session must be recorded."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import textwrap
import time
from pathlib import Path

import pytest

from ..helpers.sandbox import PROBE_CHECK, Result, Sandbox, needs_root

pytestmark = needs_root


def attempt(box: Sandbox, code: str, **kw: object) -> Result:
    result = box.python(textwrap.dedent(code), **kw)  # type: ignore[arg-type]
    assert "launch" in result.kinds() and "exit" in result.kinds(), "the session was not recorded"
    return result


def blocked(box: Sandbox, code: str, **kw: object) -> str:
    """Run code that prints ESCAPED on success; return its output after checking it did not."""
    result = attempt(box, code, **kw)
    assert "ESCAPED" not in result.out, result.out + result.err
    assert "BLOCKED" in result.out, result.out + result.err
    return result.out


TRY = PROBE_CHECK


def test_symlink_to_denied_and_outside_files(sandbox: Sandbox) -> None:
    (sandbox.ws / "to-secret").symlink_to(sandbox.ws / "secret.txt")
    (sandbox.ws / "to-outside").symlink_to(sandbox.outside / "private.txt")
    out = blocked(
        sandbox,
        TRY
        + f"""
for name in ("to-secret", "to-outside"):
    def read(name=name):
        data = open({str(sandbox.ws)!r} + "/" + name).read()
        if "CONTENT" not in data: raise OSError(errno.EACCES, "masked")
    check(name, read)
""",
    )
    assert out.count("BLOCKED") == 2


def test_hard_link_to_a_denied_file(sandbox: Sandbox) -> None:
    os.link(sandbox.ws / "secret.txt", sandbox.ws / "alias.txt")  # made before launch, outside the sandbox
    out = blocked(
        sandbox,
        TRY
        + f"""
def read():
    if "CONTENT" in open({str(sandbox.ws / "alias.txt")!r}).read(): return
    raise OSError(errno.EACCES, "masked")
check("pre-made hard link", read)
check("new hard link to outside", lambda: os.link({str(sandbox.outside / "private.txt")!r},
                                                  {str(sandbox.ws / "alias2.txt")!r}))
check("new hard link to the masked file", lambda: os.link({str(sandbox.ws / "secret.txt")!r},
                                                          {str(sandbox.ws / "alias3.txt")!r}))
""",
    )
    assert out.count("BLOCKED") == 3


def test_dotdot_proc_root_and_openat2(sandbox: Sandbox) -> None:
    out = blocked(
        sandbox,
        TRY
        + f"""
target = {str(sandbox.outside / "private.txt")!r}
check("..", lambda: open({str(sandbox.ws)!r} + "/../outside/private.txt").read())
check("/proc/self/root", lambda: open("/proc/self/root" + target).read())
check("/proc/pid/root", lambda: open(f"/proc/{{os.getpid()}}/root" + target).read())
class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]
def openat2():
    how = OpenHow(os.O_RDONLY, 0, 0)
    fd = libc.syscall(437, -100, target.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0: raise OSError(ctypes.get_errno(), "openat2")
check("openat2", openat2)
""",
    )
    assert out.count("BLOCKED") == 4


def test_write_outside_and_rename_out(sandbox: Sandbox) -> None:
    out = blocked(
        sandbox,
        TRY
        + f"""
check("write outside", lambda: open({str(sandbox.outside / "new.txt")!r}, "w"))
check("rename out of the workspace", lambda: os.rename({str(sandbox.ws / "notes.txt")!r},
                                                         {str(sandbox.outside / "moved.txt")!r}))
check("write /etc", lambda: open("/etc/adl-escape", "w"))
""",
    )
    assert out.count("BLOCKED") == 3 and not (sandbox.outside / "new.txt").exists()


def test_names_created_under_a_denied_pattern_after_launch(sandbox: Sandbox) -> None:
    ws = str(sandbox.ws)
    (sandbox.ws / "sub").mkdir()
    out = blocked(
        sandbox,
        TRY
        + f"""
ws = {ws!r}
os.symlink(ws + "/via-link.pem", ws + "/alias")  # an allowed name pointing at a denied one
def libc_call(name, *args):
    if getattr(libc, name)(*args) < 0:
        raise OSError(ctypes.get_errno(), name)
check("open 'w'", lambda: open(ws + "/new-key.pem", "w").write("x"))
check("O_CREAT|O_EXCL", lambda: os.open(ws + "/excl.pem", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
check("creat", lambda: libc_call("creat", (ws + "/creat.pem").encode(), 0o600))
check("openat relative", lambda: os.open("rel.pem", os.O_CREAT | os.O_WRONLY, dir_fd=os.open(ws + "/sub", os.O_PATH)))
check("relative to cwd", lambda: (os.chdir(ws + "/sub"), open("cwd.pem", "w")))
check("through a symlink", lambda: open(ws + "/alias", "w").write("x"))
check("mkdir", lambda: os.mkdir(ws + "/dir.pem"))
check("mkfifo", lambda: os.mkfifo(ws + "/fifo.pem"))
check("rename", lambda: os.rename(ws + "/notes.txt", ws + "/renamed.pem"))
check("rename onto the masked denied file", lambda: os.rename(ws + "/sub", ws + "/secret.txt"))
check("hard link", lambda: os.link(ws + "/notes.txt", ws + "/linked.pem"))
check("symlink", lambda: os.symlink("/etc/hostname", ws + "/sym.pem"))
check("openat2 (no inspectable flags)", lambda: libc_call("syscall", 437, -100, b"x", None, 0))
""",
    )
    assert out.count("BLOCKED") == 13, out
    assert out.count("BLOCKED open") >= 1 and " 13" in out  # EACCES
    created = sorted(p.name for p in sandbox.ws.rglob("*.pem"))
    assert created == ["key.pem"], created  # the one that existed before launch
    assert (sandbox.ws / "notes.txt").exists()


def test_the_agent_cannot_stop_the_creation_guard(sandbox: Sandbox) -> None:
    """The guard is a sibling process the agent could find by pid; Landlock's signal scope keeps the
    agent's SIGKILL away from it, and were it dead, guarded calls would fail rather than run."""
    ws = str(sandbox.ws)
    result = attempt(
        sandbox,
        f"""
import os, signal
me, parent = os.getpid(), os.getppid()
refused = 0
for pid in range(max(2, me - 20), me + 40):
    if pid in (me, parent):
        continue
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        refused += 1
open({ws!r} + "/after-kill.txt", "w").write("ok")
try:
    open({ws!r} + "/after-kill.pem", "w")
    print("ESCAPED")
except OSError as exc:
    print("BLOCKED", exc.errno, "refused kills", refused)
""",
    )
    assert "BLOCKED 13" in result.out and "ESCAPED" not in result.out, result.out + result.err
    assert int(result.out.split()[-1]) >= 1  # at least the guard itself refused the signal
    assert (sandbox.ws / "after-kill.txt").exists() and not (sandbox.ws / "after-kill.pem").exists()


def test_created_name_refusals_are_audited(sandbox: Sandbox) -> None:
    ws = str(sandbox.ws)
    code = f"try:\n    open({ws!r} + '/leak.pem', 'w')\nexcept OSError as e:\n    print(e)"
    result = attempt(sandbox, code)
    decisions = [r["payload"] for r in result.records if r["intent"] == "adl.enforcer.decision"]
    denials = [d for d in decisions if "creation guard" in d.get("enforced_by", "")]  # not the kernel's own
    assert [(d["decision"], d["syscall"], d["path"], d["rules"]) for d in denials] == [
        ("deny", "openat", f"{ws}/leak.pem", ["fs.denied"])
    ]
    assert result.record("exit")["payload"]["creations_refused"] == 1


def test_a_racing_writer_cannot_swap_the_checked_name(sandbox: Sandbox) -> None:
    """The guard reads the path once and uses that copy; rewriting the buffer during the call changes
    nothing (a CONTINUE-style check would re-read it and create the denied name)."""
    ws = str(sandbox.ws)
    result = attempt(
        sandbox,
        f"""
import ctypes, mmap, os, signal
libc = ctypes.CDLL(None, use_errno=True)
good, bad = ({ws!r} + "/fine.txt").encode() + b"\\0", ({ws!r} + "/racy.pem").encode() + b"\\0"
shared = mmap.mmap(-1, 4096)  # MAP_SHARED: a second process rewrites it, no GIL in the way
shared[: len(good)] = good
flipper = os.fork()
if flipper == 0:
    while True:
        shared[: len(bad)] = bad
        shared[: len(good)] = good
address = ctypes.addressof(ctypes.c_char.from_buffer(shared))
opened = 0
for _ in range(1500):
    fd = libc.open(ctypes.c_void_p(address), os.O_CREAT | os.O_WRONLY, 0o600)
    if fd >= 0:
        opened += 1
        os.close(fd)
os.kill(flipper, signal.SIGKILL)
print("opened", opened)
""",
        policy=sandbox.policy(permissions={"resource_limits": {"max_duration_sec": 30}}),
    )
    assert "opened" in result.out, result.err
    assert not (sandbox.ws / "racy.pem").exists()
    assert int(result.out.split()[-1]) > 0  # the allowed name was created often enough for a race to matter


def test_exec_escapes(sandbox: Sandbox) -> None:
    out = blocked(
        sandbox,
        TRY
        + """
import subprocess
def run(argv):
    done = subprocess.run(argv, capture_output=True)
    if done.returncode != 0:
        raise OSError(errno.EACCES, done.stderr.decode()[-200:])
check("sh -c", lambda: run(["sh", "-c", "id"]))
check("bash", lambda: run(["/bin/bash", "-c", "id"]))
check("execv id", lambda: run(["/usr/bin/id"]))
check("ld.so", lambda: run(["/lib64/ld-linux-x86-64.so.2", "/usr/bin/id"]))
def memfd_exec():
    fd = libc.syscall(319, b"x", 0)  # memfd_create
    if fd < 0: raise OSError(ctypes.get_errno(), "memfd_create")
    os.write(fd, open("/usr/bin/cat", "rb").read())
    os.execve(fd, ["cat"], {})
check("memfd_create+execveat", memfd_exec)
def execveat():
    fd = os.open("/usr/bin/cat", os.O_RDONLY)
    if libc.syscall(322, fd, b"", None, None, 0x1000) < 0: raise OSError(ctypes.get_errno(), "execveat")
check("execveat", execveat)
""",
    )
    assert out.count("BLOCKED") == 6


def test_dropped_variable_via_parent_environ(sandbox: Sandbox) -> None:
    out = blocked(
        sandbox,
        TRY
        + """
def read_parent():
    data = open(f"/proc/{os.getppid()}/environ", "rb").read()
    if b"DROPPED_SECRET=leak" in data: return
    raise OSError(errno.EACCES, "absent")
check("parent environ", read_parent)
check("env", lambda: (_ for _ in ()).throw(OSError(0, "absent")) if "DROPPED_SECRET" not in os.environ else None)
""",
        env={"DROPPED_SECRET": "leak"},
    )
    assert out.count("BLOCKED") == 2


def test_kernel_surface(sandbox: Sandbox) -> None:
    out = blocked(
        sandbox,
        TRY
        + """
def sys(nr, *args):
    if libc.syscall(nr, *args) < 0: raise OSError(ctypes.get_errno(), str(nr))
params = ctypes.create_string_buffer(120)
check("io_uring_setup", lambda: sys(425, 8, params))
check("ptrace parent", lambda: sys(101, 16, os.getppid(), 0, 0))  # PTRACE_ATTACH
check("unshare user", lambda: sys(272, 0x10000000))
check("unshare net", lambda: sys(272, 0x40000000))
check("setns host net", lambda: sys(308, os.open("/proc/1/ns/net", os.O_RDONLY), 0))
check("mount", lambda: sys(165, b"none", b"/tmp", b"tmpfs", 0, None))
check("raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
check("netlink socket", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
check("packet socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0))
check("unix socket upper-bit garbage", lambda: sys(41, ctypes.c_long(0xDEAD00000000 | 1), 1, 0))
check("bpf", lambda: sys(321, 0, None, 0))
check("TIOCSTI", lambda: sys(16, 0, 0x5412, ctypes.byref(ctypes.c_char(b"x"))))
check("raise own priority", lambda: os.setpriority(os.PRIO_PROCESS, 0, -5))
""",
    )
    assert out.count("BLOCKED") == 13


def test_unix_sockets_in_the_host(sandbox: Sandbox, tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as abstract:
        server.bind(path)
        server.listen()
        abstract.bind("\0adl-test-abstract")
        abstract.listen()
        out = blocked(
            sandbox,
            TRY
            + f"""
def connect(address):
    s = socket.socket(socket.AF_UNIX)
    s.connect(address)
check("pathname socket", lambda: connect({path!r}))
check("abstract socket", lambda: connect("\\0adl-test-abstract"))
""",
        )
    assert out.count("BLOCKED") == 2


SYSV_IPC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_RMID = 0o1000, 0

def error(label):
    err = ctypes.get_errno()
    return OSError(err, f"{label}: {os.strerror(err)}")

def send(key, text):
    queue = libc.msgget(key, IPC_CREAT | 0o666)
    if queue < 0:
        raise error("msgget")
    message = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + len(text))
    ctypes.c_long.from_buffer(message).value = 1
    message[ctypes.sizeof(ctypes.c_long):] = text
    if libc.msgsnd(queue, message, len(text), 0o4000) != 0:  # IPC_NOWAIT
        raise error("msgsnd")
    return queue

def receive(key):
    queue = libc.msgget(key, 0)
    if queue < 0:
        raise error("msgget")
    message = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 256)
    n = libc.msgrcv(queue, message, 256, 0, 0o4000)
    if n < 0:
        raise error("msgrcv")
    return message.raw[ctypes.sizeof(ctypes.c_long):ctypes.sizeof(ctypes.c_long) + n]

def read_shm(key):
    segment = libc.shmget(key, 0, 0)
    if segment < 0:
        raise error("shmget")
    at = libc.shmat(segment, None, 0o10000)  # SHM_RDONLY
    if at in (None, ctypes.c_void_p(-1).value):
        raise error("shmat")
    return ctypes.string_at(at, 32).rstrip(b"\\0")

def remove(key):
    queue = libc.msgget(key, 0)
    if queue >= 0:
        libc.msgctl(queue, IPC_RMID, None)
    segment = libc.shmget(key, 0, 0)
    if segment >= 0:
        libc.shmctl(segment, IPC_RMID, None)
"""


def test_no_system_v_ipc_shared_with_the_host_or_other_sessions(sandbox: Sandbox) -> None:
    """Message queues and shared memory are named by integer keys, not paths: neither Landlock nor a
    mount sees them. In the host's IPC namespace an agent reads a host queue or segment left open to
    all, and leaves one behind that outlives its session: a channel to the next session (of any
    agent, whatever that one's grants), past every filesystem and network rule."""
    import secrets

    host: dict[str, object] = {}
    exec(SYSV_IPC, host)  # the same helpers, on the host's side
    key_in, key_out, key_shm = (secrets.randbits(30) | 1 for _ in range(3))
    send, receive, remove = host["send"], host["receive"], host["remove"]
    libc = host["libc"]
    segment = libc.shmget(key_shm, 4096, 0o1000 | 0o666)  # type: ignore[attr-defined]
    assert segment >= 0
    at = libc.shmat(segment, None, 0)  # type: ignore[attr-defined]
    ctypes_mod = host["ctypes"]
    ctypes_mod.memmove(at, b"HOST-SHM-SECRET", 15)  # type: ignore[attr-defined]
    try:
        send(key_in, b"HOST-QUEUE-SECRET")  # type: ignore[operator]
        out = blocked(
            sandbox,
            TRY
            + SYSV_IPC
            + f"""
def leak(read):
    data = read()
    print("READ", data)
    if b"SECRET" in data:
        return
    raise OSError(errno.ENOENT, "no such object")
check("host queue", lambda: leak(lambda: receive({key_in})))
check("host shared memory", lambda: leak(lambda: read_shm({key_shm})))
send({key_out}, b"LEFT-BY-THE-AGENT")
print("SENT")
""",
        )
        assert out.count("BLOCKED") == 2 and "SENT" in out, out
        with pytest.raises(OSError):  # nothing the agent made is left in the host's namespace
            print("host received", receive(key_out))  # type: ignore[operator]
        assert receive(key_in) == b"HOST-QUEUE-SECRET"  # type: ignore[operator]  # the host's own is intact
    finally:
        libc.shmdt(ctypes_mod.c_void_p(at))  # type: ignore[attr-defined]
        for key in (key_in, key_out, key_shm):
            remove(key)  # type: ignore[operator]


def test_fork_bomb_hits_the_pids_limit(sandbox: Sandbox) -> None:
    r = attempt(
        sandbox,
        """
import os, time
children = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        children += 1
except OSError:
    print("limited after", children)
    raise SystemExit(3)
""",
        args=("--pids-max", "40"),
    )
    assert r.code == 3 and r.record("exit")["payload"]["reason"] == "pids_limit", r.err
    assert int(r.out.split()[-1]) < 40


def test_memory_bomb_is_oom_killed(sandbox: Sandbox) -> None:
    r = attempt(sandbox, "blocks = []\nwhile True: blocks.append(bytearray(16 * 1024 * 1024))")
    assert r.code == 128 + signal.SIGKILL and r.record("exit")["payload"]["reason"] == "oom"


def test_cpu_hog_is_throttled(sandbox: Sandbox) -> None:
    r = attempt(
        sandbox,
        """
import time, os
start = time.monotonic()
while time.monotonic() - start < 1.5: pass
print(os.times().user + os.times().system)
""",
    )
    cpu = float(r.out.split()[-1])
    assert r.code == 0 and cpu < 0.75, cpu  # 20% quota over 1.5 s is 0.3 s; unthrottled would be ~1.5 s


def test_double_forked_grandchild_is_killed_at_the_deadline(sandbox: Sandbox) -> None:
    # The grandchild holds a lock on a workspace file: free again only once the grandchild is gone.
    lock = sandbox.ws / "gc.lock"
    policy = sandbox.policy(permissions={**sandbox.permissions, "resource_limits": {"max_duration_sec": 2}})
    started = time.monotonic()
    r = attempt(
        sandbox,
        f"""
import fcntl, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        f = open({str(lock)!r}, "w"); fcntl.flock(f, fcntl.LOCK_EX); f.write("held"); f.flush(); time.sleep(60)
    os._exit(0)
time.sleep(60)
""",
        policy=policy,
    )
    assert r.code == 128 + signal.SIGKILL and r.record("exit")["payload"]["reason"] == "timeout"
    assert time.monotonic() - started < 20
    assert lock.read_text() == "held"  # the grandchild ran
    with lock.open() as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while it lives
