"""Who is calling the API socket: the kernel's word (SO_PEERCRED), carried to the gRPC services.

grpcio tells a service nothing about a unix-socket caller (its peer string is the caller's bound
address, which the caller chooses; its auth context is empty), so the daemon accepts the API
socket's connections itself. For each one it reads the caller's uid, gid and groups from the
kernel, connects to the gRPC server on a socket only root can reach (in a 0700 directory), binding
its own end to an abstract name that numbers the connection, and relays the bytes. The services
read that number back from the call's peer string and look the caller up (`CallerTable.of`).

One thread relays every connection with non-blocking sockets: a side that is not reading stops the
other side being read (no unbounded buffers), and transient accept() errors back off and are
logged instead of ending the listener.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .launch import BACKOFF_S, TRANSIENT_ACCEPT, Caller, caller_of, listener_share, record_accept_error

log = logging.getLogger("adl-enforcerd")
CHUNK = 1 << 16
SLOW_S = 0.5  # a request unfinished this long counts towards its uid's bound (CallerRelay)
ROOT = Caller(pid=0, uid=0, gid=0, groups=())


class CallerTable:
    """Relayed connections by number, with the caller the kernel named for each."""

    def __init__(self) -> None:
        self.prefix = f"adl-enforcerd-{secrets.token_hex(6)}-"
        self._peer_prefix = f"unix-abstract:{self.prefix}".encode()
        self._callers: dict[int, Caller] = {}
        self._per_uid: dict[int, int] = {}

    def add(self, caller: Caller) -> tuple[int, str]:
        """A number for a new connection and the abstract name that carries it. Random, not counted:
        abstract names are listed in /proc/net/unix, and a caller who could guess the next one
        could bind it first and make that connection fail."""
        number = secrets.randbits(62)
        while number in self._callers:
            number = secrets.randbits(62)
        self._callers[number] = caller
        self._per_uid[caller.uid] = self._per_uid.get(caller.uid, 0) + 1
        return number, self.prefix + str(number)

    def remove(self, number: int) -> None:
        caller = self._callers.pop(number, None)
        if caller is not None:
            left = self._per_uid[caller.uid] - 1
            if left:
                self._per_uid[caller.uid] = left
            else:
                del self._per_uid[caller.uid]

    def connections_of(self, uid: int) -> int:
        return self._per_uid.get(uid, 0)

    def of(self, peer: bytes | str) -> Caller | None:
        """The caller of a call with this peer string. A call that did not come through the relay
        reached the root-only internal socket from an unnamed socket: root. None: a relayed
        connection that has closed, or a peer string of any other form."""
        raw = peer.encode() if isinstance(peer, str) else peer
        if raw == b"unix:":  # an unnamed end: a process of root's on the 0700 directory's socket
            return ROOT
        if not raw.startswith(self._peer_prefix):
            return None  # not a peer this daemon names: refused, never guessed
        try:
            return self._callers.get(int(raw[len(self._peer_prefix) :]))
        except ValueError:
            return None


_FRAME_HEAD = struct.Struct("!BHBBI")  # length (24 bits as 8 + 16), type, flags, stream


class _Frames:
    """HTTP/2 frame headers (9 bytes: length, type, flags, stream) in a byte stream split anywhere."""

    def __init__(self, preface: int, on_frame: Callable[[int, int, int], None]) -> None:
        self._preface = preface  # bytes of the client's connection preface still to skip
        self._head = b""
        self._skip = 0  # payload bytes of the current frame still to come
        self._on_frame = on_frame

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        if self._preface:
            i = min(self._preface, n)
            self._preface -= i
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            if not self._head and i + 9 <= n:  # the usual case: a whole header in this chunk
                high, low, kind, flags, stream = _FRAME_HEAD.unpack_from(data, i)
                i += 9
            else:
                need = 9 - len(self._head)
                self._head += data[i : i + need]
                i += need
                if len(self._head) < 9:
                    return
                high, low, kind, flags, stream = _FRAME_HEAD.unpack(self._head)
                self._head = b""
            self._skip = high << 16 | low
            stream &= 0x7FFFFFFF
            if stream:
                self._on_frame(kind, flags, stream)


class RequestClock:
    """When each of a connection's requests began that the caller has not finished sending.

    grpcio's sync server holds a worker thread from a call's first frame until its request message
    has arrived, with no deadline of its own: a caller that opens calls and never finishes them
    would take every thread. So the relay follows the HTTP/2 frame headers both ways and notes when
    a stream opens (the caller's HEADERS) and when it no longer waits for the caller: the caller's
    half ends (END_STREAM on HEADERS or DATA), or either side ends the stream (RST_STREAM, or the
    server's END_STREAM)."""

    PREFACE = len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    MAX_OPEN = 1024  # more unfinished requests on one connection than any caller needs

    def __init__(self) -> None:
        self.open: dict[int, float] = {}  # stream -> when it opened
        self._now = 0.0
        self._caller = _Frames(self.PREFACE, self._from_caller)
        self._server = _Frames(0, self._from_server)

    def feed(self, data: bytes, now: float) -> None:
        """Bytes the caller sent."""
        self._now = now
        self._caller.feed(data)

    def feed_server(self, data: bytes) -> None:
        """Bytes the server sent."""
        self._server.feed(data)

    def _from_caller(self, kind: int, flags: int, stream: int) -> None:
        if kind == 0x1 and not flags & 0x1:  # HEADERS without END_STREAM: a request begins
            self.open.setdefault(stream, self._now)
        elif (kind in (0x0, 0x1) and flags & 0x1) or kind == 0x3:  # END_STREAM, or RST_STREAM
            self.open.pop(stream, None)

    def _from_server(self, kind: int, flags: int, stream: int) -> None:
        if (kind in (0x0, 0x1) and flags & 0x1) or kind == 0x3:
            self.open.pop(stream, None)

    def late(self, now: float, limit_s: float) -> bool:
        """Whether a request has been unfinished for longer than limit_s (or too many are)."""
        return len(self.open) > self.MAX_OPEN or any(now - began > limit_s for began in self.open.values())


class _Pair:
    def __init__(self, number: int, uid: int, outer: socket.socket, inner: socket.socket) -> None:
        self.number, self.uid, self.outer, self.inner = number, uid, outer, inner
        # Bytes read from one side that the other has not taken yet, by the side they go to.
        self.backlog: dict[socket.socket, bytes] = {outer: b"", inner: b""}
        self.clock = RequestClock()

    def other(self, sock: socket.socket) -> socket.socket:
        return self.inner if sock is self.outer else self.outer


class CallerRelay:
    def __init__(
        self,
        public: Path,
        internal: Path,
        table: CallerTable,
        max_connections: int = 4096,
        request_s: float = 10.0,
        sink: Any = None,
        max_unfinished_per_uid: int = 4,
    ) -> None:
        self.public, self.internal, self.table = public, internal, table
        self.sink = sink  # where accept() errors are recorded
        self.request_s = request_s
        # The deadline frees held threads only until the caller opens the same unfinished requests
        # again: a uid (root aside) may have this many unfinished for longer than SLOW_S at once,
        # over all its connections. Requests still arriving at any real speed finish well within it.
        self.max_unfinished_per_uid = max_unfinished_per_uid
        self.cut = 0  # connections closed for a request unfinished past request_s
        self._max_pairs = max_connections
        self._pairs: dict[int, _Pair] = {}  # by number, in the order accepted
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._stop = threading.Event()
        self._no_more = threading.Event()
        self.accept_errors = 0
        self._bound: tuple[int, int] | None = None  # (st_dev, st_ino) of the public socket we bound

    @staticmethod
    def internal_path(public: Path) -> Path:
        """Where the gRPC server listens: a 0700 directory beside the public socket."""
        return public.parent / f".{public.name}.d" / "grpc.sock"

    def prepare_internal(self) -> None:
        directory = self.internal.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        stat = directory.lstat()
        if stat.st_uid != os.geteuid() or stat.st_mode & 0o077 or not directory.is_dir() or directory.is_symlink():
            raise OSError(f"{directory}: must be a directory of ours with mode 0700")
        self.internal.unlink(missing_ok=True)

    def start(self, mode: int, gid: int | None) -> None:
        self.public.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.public))
        finally:
            os.umask(old)
        if gid is not None:
            os.chown(self.public, -1, gid)
        os.chmod(self.public, mode)
        st = self.public.lstat()
        self._bound = (st.st_dev, st.st_ino)
        listener.listen(256)
        listener.setblocking(False)
        # Three descriptors a connection, all in this process: the caller's, the relay's end toward
        # gRPC, and the gRPC server's end of that one. Within the API socket's share (launch.py).
        room = listener_share()
        if room is not None:
            self._max_pairs = max(1, min(self._max_pairs, room // 3))
        self._listener = listener
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        threading.Thread(target=self._serve, name="api-relay", daemon=True).start()

    def stop_accepting(self) -> None:
        """No new connections; those open keep being relayed (their answers still go out)."""
        self._no_more.set()
        self._unlink_own()

    def close(self) -> None:
        """End the relay and every connection (after the gRPC server has stopped)."""
        self._no_more.set()
        self._stop.set()
        self._unlink_own()

    def _unlink_own(self) -> None:
        """Remove the public socket only if it is still the one this relay bound."""
        with contextlib.suppress(OSError):
            st = self.public.lstat()
            if self._bound == (st.st_dev, st.st_ino):
                self.public.unlink()

    def _serve(self) -> None:
        selector = self._selector
        assert selector is not None and self._listener is not None
        resume_at = 0.0
        backoff = BACKOFF_S[0]
        swept = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now - swept >= 0.1:
                    swept = now
                    self._cut_late(now)
                if self._no_more.is_set() and self._listener.fileno() >= 0:
                    with contextlib.suppress(KeyError):
                        selector.unregister(self._listener)
                    self._listener.close()
                    resume_at = 0.0
                if resume_at and time.monotonic() >= resume_at:
                    resume_at = 0.0
                    selector.register(self._listener, selectors.EVENT_READ)
                for key, events in selector.select(timeout=0.2):
                    if key.fileobj is self._listener:
                        if self._accept_all():
                            backoff = BACKOFF_S[0]
                        else:
                            selector.unregister(self._listener)
                            resume_at = time.monotonic() + backoff
                            backoff = min(backoff * 2, BACKOFF_S[1])
                        continue
                    pair: _Pair = key.data
                    if pair.number not in self._pairs:
                        continue  # closed earlier in this round
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if events & selectors.EVENT_WRITE:
                        self._flush(pair, sock)
                    if events & selectors.EVENT_READ and pair.number in self._pairs:
                        self._pump(pair, sock)
        except OSError as exc:
            if not self._stop.is_set():
                log.error("the API socket relay stopped: %s", exc)
        finally:
            for pair in list(self._pairs.values()):
                self._close(pair)
            selector.close()
            self._listener.close()

    def _accept_all(self) -> bool:
        assert self._listener is not None
        for _ in range(64):
            try:
                outer, _ = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno not in TRANSIENT_ACCEPT:
                    raise
                self.accept_errors += 1
                record_accept_error(self.sink, "api", exc, self.accept_errors)
                return False
            caller = caller_of(outer, "API")
            if caller is None:
                continue
            uid = caller.uid
            # One uid gets a quarter of the connections at most: it cannot shut the others out.
            if len(self._pairs) >= self._max_pairs or self.table.connections_of(uid) >= max(1, self._max_pairs // 4):
                log.warning(
                    "API connection from uid %d closed: %d connections are open, %d of them its own",
                    uid,
                    len(self._pairs),
                    self.table.connections_of(uid),
                )
                outer.close()
                continue
            number, name = self.table.add(caller)
            inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                inner.bind("\0" + name)
                inner.connect(str(self.internal))
            except OSError as exc:
                log.error("API connection from uid %d: the gRPC server is unreachable: %s", uid, exc)
                self.table.remove(number)
                inner.close()
                outer.close()
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    return False
                continue
            outer.setblocking(False)
            inner.setblocking(False)
            pair = _Pair(number, uid, outer, inner)
            self._pairs[number] = pair
            assert self._selector is not None
            self._selector.register(outer, selectors.EVENT_READ, pair)
            self._selector.register(inner, selectors.EVENT_READ, pair)
        return True

    def _pump(self, pair: _Pair, source: socket.socket) -> None:
        """Read what `source` has and pass it on; stop reading it while the other side is behind."""
        target = pair.other(source)
        try:
            data = source.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            self._close(pair)
            return
        if not data:
            self._close(pair)
            return
        if source is pair.outer:
            pair.clock.feed(data, time.monotonic())
        else:  # every byte, or the frame boundaries are lost
            pair.clock.feed_server(data)
        sent = self._send(pair, target, data)
        if sent is None or sent == len(data):  # closed, or the usual case: all passed on
            return
        pair.backlog[target] = data[sent:]
        self._interest(pair, target)
        self._interest(pair, source)

    def _cut_late(self, now: float) -> None:
        self._cut_slow_uids(now)
        for pair in [p for p in self._pairs.values() if p.clock.open and p.clock.late(now, self.request_s)]:
            caller = self.table.of(f"unix-abstract:{self.table.prefix}{pair.number}")
            self.cut += 1
            log.warning(
                "API connection of uid %s closed: a request unfinished after %.0f s",
                caller.uid if caller else "?",
                self.request_s,
            )
            self._close(pair)  # the server cancels its calls: their threads are free again

    def _cut_slow_uids(self, now: float) -> None:
        """Close the connections holding slow requests of every uid with more than its bound of them."""
        slow: dict[int, list[tuple[_Pair, int]]] = {}
        for pair in self._pairs.values():
            if pair.clock.open and pair.uid != 0:
                n = sum(1 for began in pair.clock.open.values() if now - began > SLOW_S)
                if n:
                    slow.setdefault(pair.uid, []).append((pair, n))
        for uid, held in slow.items():
            if sum(n for _, n in held) <= self.max_unfinished_per_uid:
                continue
            self.cut += len(held)
            log.warning(
                "API connections of uid %d closed: more than %d requests unfinished after %.1f s at once",
                uid,
                self.max_unfinished_per_uid,
                SLOW_S,
            )
            for pair, _ in held:
                self._close(pair)

    def _send(self, pair: _Pair, target: socket.socket, data: bytes) -> int | None:
        """How much of `data` `target` took now; None when the pair was closed on an error."""
        try:
            return target.send(data)
        except BlockingIOError:
            return 0
        except OSError:
            self._close(pair)
            return None

    def _flush(self, pair: _Pair, target: socket.socket) -> None:
        data = pair.backlog[target]
        if data:
            sent = self._send(pair, target, data)
            if sent is None:
                return
            pair.backlog[target] = data[sent:]
        self._interest(pair, target)
        self._interest(pair, pair.other(target))

    def _interest(self, pair: _Pair, sock: socket.socket) -> None:
        """Read `sock` only while what it sent before has all gone on; write it while it has a backlog."""
        events = (0 if pair.backlog[pair.other(sock)] else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if pair.backlog[sock] else 0
        )
        assert self._selector is not None
        try:
            if self._selector.get_key(sock).events == events:
                return
            if events:
                self._selector.modify(sock, events, pair)
            else:
                self._selector.unregister(sock)
        except KeyError:  # not registered now
            if events:
                self._selector.register(sock, events, pair)

    def _close(self, pair: _Pair) -> None:
        self._pairs.pop(pair.number, None)
        self.table.remove(pair.number)
        assert self._selector is not None
        for sock in (pair.outer, pair.inner):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()
