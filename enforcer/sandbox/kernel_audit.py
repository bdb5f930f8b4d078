"""Kernel denials (Landlock, seccomp) read from the audit netlink multicast group, without auditd.

Landlock (ABI 7) and seccomp (filters loaded with SECCOMP_FILTER_FLAG_LOG) report denials through
the kernel audit subsystem. Any process with CAP_AUDIT_READ may listen on the read-only multicast
group AUDIT_NLGRP_READLOG; nothing is taken from auditd, which keeps its own unicast feed. The kernel
only emits these records while audit is enabled: `ensure_enabled()` turns it on (AUDIT_SET) when it
is off and says so; it never turns it off again, as other sessions may be listening.

Records of one event share the serial in `audit(SECONDS.MILLIS:SERIAL)` and end with AUDIT_EOE
when the event ran in a syscall context (Landlock's AUDIT_LANDLOCK_ACCESS + AUDIT_SYSCALL, or
AUDIT_SECCOMP). Events are attributed to a session on the host side (pids in audit records are
those of the initial PID namespace): by the Landlock domain id (the AUDIT_LANDLOCK_DOMAIN record
names the pid that created the domain: the agent's process, which announced its host pid before it
ran anything), by the denying pid or its parent (AUDIT_SYSCALL's ppid) being one of the session's,
else by the session's cgroup as read from /proc/PID/cgroup while the process still exists. A pid
that still exists counts as the session's only while it is in the session's cgroup: pids are reused.
"""

from __future__ import annotations

import _thread
import contextlib
import errno
import os
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import field

from ..quick_dataclass import dataclass
from . import netlink

NETLINK_AUDIT = 9
AUDIT_NLGRP_READLOG = 1
AUDIT_GET, AUDIT_SET = 1000, 1001
AUDIT_USER = 1005  # a message from user space, logged (and multicast) like the kernel's own records
AUDIT_STATUS_ENABLED = 0x0001
AUDIT_STATUS_BACKLOG_LIMIT = 0x0010
# The kernel's default queue (64 records) overflows within milliseconds of a denial loop; this is
# what auditd configures by default. Raised, never lowered.
BACKLOG_LIMIT = 8192
AUDIT_SYSCALL = 1300
AUDIT_EOE = 1320
AUDIT_SECCOMP = 1326
AUDIT_LANDLOCK_ACCESS = 1423
AUDIT_LANDLOCK_DOMAIN = 1424
_NLMSG_ERROR = netlink.NLMSG_ERROR
_NLM_F_REQUEST, _NLM_F_ACK = netlink.NLM_F_REQUEST, netlink.NLM_F_ACK
_HEADER = netlink.HEADER
_STATUS = struct.Struct("=IIIIIIIIIII")  # struct audit_status up to backlog_wait_time
_INTERESTING = frozenset({AUDIT_SYSCALL, AUDIT_EOE, AUDIT_SECCOMP, AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN})
_STAMP = re.compile(rb"^audit\((\d+)\.(\d+):(\d+)\):\s?")
_FIELD = re.compile(r'([a-z_0-9-]+)=("[^"]*"|\S*)')
# Values the kernel prints with audit_log_untrustedstring: quoted, or hex when they hold a quote,
# a space or a control character.
_UNTRUSTED = frozenset({"path", "comm", "exe", "name", "proctitle", "ocomm"})
_SECCOMP_RET_ACTION = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_TRAP = 0x00030000
_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_KILL_THREAD = 0x00000000
_RCVBUF = 8 << 20
_EVENT_GRACE_S = 0.2  # an event without AUDIT_EOE is complete once this old
_MAX_REMEMBERED = 65536


class KernelAuditUnavailable(OSError):
    """The audit netlink socket cannot be used here (no CONFIG_AUDIT, no CAP_AUDIT_READ...)."""


# ---- parsing (pure) ---------------------------------------------------------------------------


def parse_fields(text: str) -> dict[str, str]:
    """`key=value` pairs of one audit record; quoted values unquoted, hex-encoded untrusted strings
    decoded."""
    fields: dict[str, str] = {}
    for key, raw in _FIELD.findall(text):
        if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
            value = raw[1:-1]
        elif key in _UNTRUSTED and raw and raw != "(null)" and len(raw) % 2 == 0:
            try:
                # Bytes that are not UTF-8 (a name the agent chose) as \xNN: lone surrogates would
                # make the record one the audit log's encoder refuses, hiding the denial.
                value = bytes.fromhex(raw).decode("utf-8", "backslashreplace")
            except ValueError:
                value = raw
        else:
            value = raw
        fields.setdefault(key, value)
    return fields


@dataclass(frozen=True)
class Record:
    type: int
    serial: int
    ts: float
    fields: dict[str, str]


def parse_record(msg_type: int, body: bytes) -> Record | None:
    stamp = _STAMP.match(body)
    if stamp is None:
        return None
    text = body[stamp.end() :].rstrip(b"\0\n").decode("utf-8", "surrogateescape")
    ts = int(stamp.group(1)) + int(stamp.group(2)) / 1000
    return Record(msg_type, int(stamp.group(3)), ts, parse_fields(text))


@dataclass(frozen=True)
class Denial:
    """One kernel denial, as reported."""

    mechanism: str  # landlock | seccomp
    ts: float
    serial: int
    pid: int | None
    comm: str | None
    exe: str | None
    blockers: tuple[str, ...] = ()  # landlock: fs.read_file, net.connect_tcp, scope.signal, ...
    path: str | None = None
    port: int | None = None
    address: str | None = None
    syscall: int | None = None
    domain: str | None = None  # landlock domain id
    domain_creator: int | None = None  # pid that created the domain, when this event first named it
    ppid: int | None = None  # the denying process's parent, from the event's AUDIT_SYSCALL record
    code: int | None = None  # seccomp return action
    extra: dict[str, str] = field(default_factory=dict)


def _int(value: str | None, base: int = 10) -> int | None:
    try:
        return int(value, base) if value is not None else None
    except ValueError:
        return None


def denials_of(records: list[Record]) -> list[Denial]:
    """The denials in one audit event (records sharing a serial)."""
    syscall = next((r.fields for r in records if r.type == AUDIT_SYSCALL), {})
    creators = {
        r.fields.get("domain"): _int(r.fields.get("pid"))
        for r in records
        if r.type == AUDIT_LANDLOCK_DOMAIN and r.fields.get("status") == "allocated"
    }
    found = []
    for r in records:
        if r.type == AUDIT_LANDLOCK_ACCESS:
            f = r.fields
            domain = f.get("domain")
            extra = {k: v for k, v in f.items() if k in ("dev", "ino", "opid", "ocomm", "saddr", "src")}
            found.append(
                Denial(
                    "landlock",
                    r.ts,
                    r.serial,
                    _int(syscall.get("pid")),
                    syscall.get("comm"),
                    syscall.get("exe"),
                    blockers=tuple(b for b in f.get("blockers", "").split(",") if b),
                    path=f.get("path") or f.get("name"),
                    port=_int(f.get("dest") or f.get("src")),
                    address=f.get("daddr") or f.get("saddr"),
                    syscall=_int(syscall.get("syscall")),
                    domain=domain,
                    domain_creator=creators.get(domain),
                    ppid=_int(syscall.get("ppid")),
                    extra=extra,
                )
            )
        elif r.type == AUDIT_SECCOMP:
            f = r.fields
            code = _int(f.get("code"), 16)
            if code is None or not _is_seccomp_denial(code):
                continue
            found.append(
                Denial(
                    "seccomp",
                    r.ts,
                    r.serial,
                    _int(f.get("pid")),
                    f.get("comm"),
                    f.get("exe"),
                    syscall=_int(f.get("syscall")),
                    code=code,
                    ppid=_int(syscall.get("ppid")) if syscall.get("pid") == f.get("pid") else None,
                )
            )
    return found


def _is_seccomp_denial(code: int) -> bool:
    action = code & _SECCOMP_RET_ACTION
    if action == _SECCOMP_RET_ERRNO:
        # ENOSYS answers (clone3, openat2) make libc fall back to an older call that is checked:
        # a hint, not a denial.
        return (code & 0xFFFF) != errno.ENOSYS
    return action in (_SECCOMP_RET_TRAP, _SECCOMP_RET_KILL_THREAD) or code & 0xFFFF0000 == _SECCOMP_RET_KILL_PROCESS


# ---- the netlink socket -----------------------------------------------------------------------


_CLONE_NEWNET = 0x40000000


def _initial_netns_path() -> str | None:
    """kthreadd (pid 2) lives in the initial network namespace and, unlike pid 1, is readable
    where pid 1 is protected; None when neither can be read (then this process's own is used)."""
    candidates = []
    with contextlib.suppress(OSError), open("/proc/2/comm") as f:
        if f.read().strip() == "kthreadd":
            candidates.append("/proc/2/ns/net")
    candidates.append("/proc/1/ns/net")
    for path in candidates:
        with contextlib.suppress(OSError):
            os.stat(path)
            return path
    return None


def _in_initial_netns(make: Callable[[], socket.socket]) -> socket.socket:
    """The kernel sends audit records to netlink sockets of the initial network namespace only: a
    launcher running in another one (a network lab, a container's) creates its socket there, from a
    short-lived thread (the network namespace is per thread), when it may."""
    initial = _initial_netns_path()
    if initial is None or os.stat("/proc/self/ns/net").st_ino == os.stat(initial).st_ino:
        return make()
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_make() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(initial, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise KernelAuditUnavailable(err, f"cannot reach the initial network namespace: {os.strerror(err)}")
            finally:
                os.close(fd)
            made.append(make())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=enter_and_make, name="audit-netns")
    thread.start()
    thread.join(10)
    if failed:
        raise failed[0]
    if not made:
        raise KernelAuditUnavailable(errno.ETIMEDOUT, "no audit socket from the initial network namespace")
    return made[0]


def _request(sock: socket.socket, msg_type: int, payload: bytes = b"") -> None:
    sock.send(_HEADER.pack(_HEADER.size + len(payload), msg_type, _NLM_F_REQUEST | _NLM_F_ACK, 1, 0) + payload)


def _control_socket() -> socket.socket:
    try:
        sock = _in_initial_netns(
            lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_AUDIT)
        )
    except OSError as exc:
        raise KernelAuditUnavailable(exc.errno, f"no kernel audit netlink socket: {exc.strerror}") from None
    sock.settimeout(2.0)
    sock.bind((0, 0))
    return sock


def status() -> dict[str, int]:
    """The kernel's audit status: enabled (0 off, 1 on, 2 locked on), failure, pid, rate_limit,
    backlog_limit, lost, backlog."""
    with _control_socket() as sock:
        _request(sock, AUDIT_GET)
        for _ in range(4):
            data = sock.recv(65536)
            _, msg_type, _, _, _ = _HEADER.unpack_from(data)
            if msg_type == AUDIT_GET:
                values = struct.unpack_from("=IIIIIIII", data, _HEADER.size)
                names = ("mask", "enabled", "failure", "pid", "rate_limit", "backlog_limit", "lost", "backlog")
                return dict(zip(names, values, strict=True))
            if msg_type == _NLMSG_ERROR:
                (error,) = struct.unpack_from("=i", data, _HEADER.size)
                if error:
                    raise KernelAuditUnavailable(-error, f"AUDIT_GET: {os.strerror(-error)}")
    raise KernelAuditUnavailable(errno.EPROTO, "AUDIT_GET: no status answer")


def _set(mask: int, enabled: int = 0, backlog_limit: int = 0) -> None:
    with _control_socket() as sock:
        _request(sock, AUDIT_SET, _STATUS.pack(mask, enabled, 0, 0, 0, backlog_limit, 0, 0, 0, 0, 0))
        data = sock.recv(65536)
        _, msg_type, _, _, _ = _HEADER.unpack_from(data)
        if msg_type == _NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, _HEADER.size)
            if error:
                raise KernelAuditUnavailable(-error, f"AUDIT_SET: {os.strerror(-error)}")


def ensure_enabled() -> list[str]:
    """Turn kernel auditing on if it is off (Landlock and seccomp log nothing otherwise) and raise a
    small backlog limit. What was changed, for the audit log."""
    current = status()
    changed = []
    if not current["enabled"]:
        _set(AUDIT_STATUS_ENABLED, enabled=1)
        changed.append("enabled kernel auditing (it was off)")
    if current["enabled"] != 2 and 0 < current["backlog_limit"] < BACKLOG_LIMIT:
        _set(AUDIT_STATUS_BACKLOG_LIMIT, backlog_limit=BACKLOG_LIMIT)
        changed.append(f"raised the kernel audit backlog limit from {current['backlog_limit']} to {BACKLOG_LIMIT}")
    return changed


def describe(landlock_abi: int) -> str:
    """What a launch from this process would do about kernel denials, for --explain (reads the
    kernel's audit status only; changes nothing)."""
    try:
        current = status()
    except OSError as exc:
        return f"unavailable here ({exc.strerror or exc}): sessions run, their kernel denials are not recorded"
    if current["enabled"]:
        what = "recorded in the audit log (kernel auditing is on)"
    else:
        what = (
            "recorded in the audit log; kernel auditing is OFF on this host and the launch turns it ON for "
            "the whole host (left on; recorded in the audit log)"
        )
    if landlock_abi < 7:
        what += f"; Landlock ABI {landlock_abi} does not report its denials (7 does): seccomp's only"
    return what


def open_multicast() -> socket.socket:
    """A socket on the read-only log group, with a large receive buffer so bursts are not lost."""
    try:
        sock = _in_initial_netns(
            lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_AUDIT)
        )
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)  # SO_RCVBUFFORCE (root)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < _RCVBUF:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        sock.bind((0, 1 << (AUDIT_NLGRP_READLOG - 1)))
    except OSError as exc:
        raise KernelAuditUnavailable(exc.errno, f"cannot join the audit log group: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, body) of each netlink message in one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, msg_type, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield msg_type, data[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


# ---- attribution ------------------------------------------------------------------------------


def cgroup_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return f.read(8192)
    except OSError:
        return None


class Attribution:
    """Which denials belong to one session: its Landlock domains (learned from the domain's creator
    pid) and its processes: `roots()` (the session's init and agent process, known from the launch
    on), the pids learned from their denials, and the members of its cgroup directory."""

    def __init__(self, session: str, roots: Callable[[], Iterable[int]], group: str) -> None:
        self.marker = f"/{group}/{session}"
        self.roots = roots
        self.domains: set[str] = set()
        self.pids: set[int] = set()
        self.foreign_domains: set[str] = set()

    def in_cgroup(self, pid: int) -> bool | None:
        """None once the process is gone."""
        text = cgroup_of(pid)
        if text is None:
            return None
        return any(line.endswith(self.marker) or self.marker + "/" in line for line in text.splitlines())

    def is_member(self, pid: int | None) -> bool:
        if pid is None or pid <= 0:
            return False
        now = self.in_cgroup(pid)
        if now is not None:
            return now  # a remembered pid now in another cgroup was reused
        return pid in self.pids or pid in set(self.roots())

    def owns(self, denial: Denial) -> bool:
        for known in (self.pids, self.domains, self.foreign_domains):
            if len(known) > _MAX_REMEMBERED:  # a fork loop cannot grow them without bound
                known.clear()
        domain = denial.domain
        if domain is not None:
            if domain in self.domains:
                return True
            if domain in self.foreign_domains:
                return False
            if denial.domain_creator is not None and self.is_member(denial.domain_creator):
                self.domains.add(domain)
                return True
        pid = denial.pid
        if self.is_member(pid) or (pid is not None and self.in_cgroup(pid) is None and self.is_member(denial.ppid)):
            self.pids.add(pid)  # type: ignore[arg-type]
            if domain is not None:
                self.domains.add(domain)
            return True
        if domain is not None and denial.domain_creator is not None:
            self.foreign_domains.add(domain)
        return False


# ---- the reader thread ------------------------------------------------------------------------


class Reader:
    """Reads the log group on a thread and hands each of the session's denials to `sink`.

    Open it before the agent starts (records are buffered by the socket until read) and stop it
    after the agent's cgroup is empty; stop() drains what the kernel already queued."""

    def __init__(self, attribution: Attribution, sink: Callable[[Denial], None]) -> None:
        self.attribution = attribution
        self.sink = sink
        self.sock = open_multicast()
        self.lost_datagrams = 0  # ENOBUFS: the socket overflowed and the kernel dropped some
        self.events = 0
        self._pending: dict[int, tuple[float, list[Record]]] = {}
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._done: threading.Event | None = None  # set when the reading thread has returned
        self.error: BaseException | None = None

    def start(self) -> None:
        # A bare thread: threading.Thread.start() waits until the new thread has been scheduled,
        # which the launch would wait for on a busy machine; nothing here needs it to be running yet
        # (the socket holds the records until they are read).
        self._done = threading.Event()
        _thread.start_new_thread(self._run_then_done, (self._done,))

    def _run_then_done(self, done: threading.Event) -> None:
        try:
            self._run()
        finally:
            done.set()

    def stop(self) -> None:
        """Read what kauditd still sends (it runs asynchronously) until it goes quiet, then stop."""
        if self._done is not None:
            os.write(self._stop_w, b"x")
            self._done.wait(10)
        self._flush(everything=True)
        self.sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _run(self) -> None:
        try:
            # poll, not select: descriptors above 1023 are adl-exec's when its caller left many open.
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            poller.register(self._stop_r, select.POLLIN)
            while True:
                ready = {fd for fd, _events in poller.poll(_EVENT_GRACE_S * 1000)}
                if self.sock.fileno() in ready:
                    self._read_available()
                self._flush(everything=False)
                if self._stop_r in ready:
                    self._drain()
                    return
        except BaseException as exc:  # reported by the session, never lost silently
            self.error = exc

    def _drain(self) -> None:
        """The session's processes are gone, so every record of theirs is already in the kernel's
        queue, which kauditd sends to the group in order: a marker queued now arrives after them.
        Without the marker (user messages filtered out by the host's audit rules, rate-limited,
        no CAP_AUDIT_WRITE), wait until the queue is empty instead. Bounded: a second at most."""
        nonce = self._send_marker()
        arrived = select.poll()
        arrived.register(self.sock, select.POLLIN)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if nonce is not None:
                # Woken by what arrives (the marker, usually within a fraction of a millisecond);
                # the queue is asked about only once nothing has arrived for a while.
                if arrived.poll(20):
                    if self._read_available(nonce):
                        return
                    continue
            else:
                self._read_available()
            try:
                empty = status()["backlog"] == 0
            except OSError:
                empty = False
            if empty:
                time.sleep(0.005)  # kauditd dequeues, then sends: let the last one land
                self._read_available()
                return
            if nonce is None:
                time.sleep(0.02)

    def _send_marker(self) -> bytes | None:
        """Queue an AUDIT_USER message naming a random nonce (no other process can send the same
        one ahead of time); None if the kernel refused it."""
        nonce = os.urandom(16).hex().encode()  # as secrets.token_hex, without importing random
        try:
            with _control_socket() as sock:
                _request(sock, AUDIT_USER, b"op=adl-enforcer-drain nonce=" + nonce + b"\0")
                answer = sock.recv(65536)
        except OSError:
            return None
        _, msg_type, _, _, _ = _HEADER.unpack_from(answer)
        if msg_type == _NLMSG_ERROR and struct.unpack_from("=i", answer, _HEADER.size)[0] != 0:
            return None
        return nonce

    def _read_available(self, marker: bytes | None = None) -> bool:
        """Whether a record holding `marker` (the drain's nonce) was among those read."""
        seen = False
        for _ in range(4096):  # bounded: the stop pipe and the grace flush get their turn
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return seen
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.lost_datagrams += 1
                    continue
                raise
            for msg_type, body in messages(data):
                if msg_type == AUDIT_USER and marker is not None and b" nonce=" + marker + b"'" in body:
                    seen = True
                if msg_type not in _INTERESTING:
                    continue
                record = parse_record(msg_type, body)
                if record is None:
                    continue
                if msg_type == AUDIT_EOE:
                    entry = self._pending.pop(record.serial, None)
                    if entry is not None:
                        self._event(entry[1])
                    continue
                if record.serial not in self._pending and len(self._pending) >= _MAX_REMEMBERED:
                    self._flush(everything=True)
                self._pending.setdefault(record.serial, (time.monotonic(), []))[1].append(record)
        return seen

    def _flush(self, everything: bool) -> None:
        cutoff = time.monotonic() - _EVENT_GRACE_S
        for serial in [s for s, (t, _) in self._pending.items() if everything or t < cutoff]:
            self._event(self._pending.pop(serial)[1])

    def _event(self, records: list[Record]) -> None:
        self.events += 1
        for denial in denials_of(records):
            if self.attribution.owns(denial):
                self.sink(denial)
