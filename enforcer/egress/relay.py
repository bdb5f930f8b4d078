"""Moving bytes between the agent's socket and the upstream socket: splice(2) through a pipe, so the
bytes never enter Python (the GIL is released inside splice). Only what the filter must read passes
through Python: a connection's first message and plain-HTTP heads. A connection whose every later
byte is spliced (TLS, opaque TCP) is relayed both ways by one Relay, stepped by the connection loop
as its sockets become ready (or by relay_here's own poll on a handling thread); plain HTTP, whose
requests are read one by one, has a thread per direction (relay)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Executor

CHUNK = 1 << 20
_PIPE_SIZE = 1 << 20
_FLAGS = os.SPLICE_F_MOVE  # not SPLICE_F_MORE: it corks the socket, delaying a small request
_NONBLOCK = _FLAGS | os.SPLICE_F_NONBLOCK
_FIONREAD = 0x541B  # asm-generic/ioctls.h: bytes waiting in a pipe
_SIOCATMARK = 0x8905  # asm-generic/sockios.h: the next byte to read is TCP urgent data
# Empty pipes kept for the next connections, whichever thread relays them. Bounded, so that what a
# burst of connections leaves behind is a few descriptors, not two pipes per pool thread.
MAX_KEPT_PIPES = 64
_kept: list[tuple[int, int]] = []
_kept_lock = threading.Lock()


def _pump(src: socket.socket, dst: socket.socket, counter: list[int], index: int) -> None:
    read_end, write_end = _new_pipe()
    try:
        src_fd, dst_fd = src.fileno(), dst.fileno()
        while True:
            moved = os.splice(src_fd, write_end, CHUNK, flags=_FLAGS)
            if moved == 0:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            counter[index] += moved
            while moved:
                moved -= os.splice(read_end, dst_fd, moved, flags=_FLAGS)
    except OSError:
        end_both(src, dst)  # one side reset (shutdown wakes the other thread's blocking splice)
    finally:
        os.close(read_end)
        os.close(write_end)


def pump(src: socket.socket, dst: socket.socket) -> int:
    """Splice src into dst until src ends; the bytes moved."""
    counter = [0]
    _pump(src, dst, counter, 0)
    return counter[0]


def splice_exact(src: socket.socket, dst: socket.socket, size: int) -> int:
    """Move exactly `size` bytes from src to dst without them entering Python (a request body).
    Returns the bytes moved: fewer only when src ended first."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    moved_total = 0
    try:
        src_fd, dst_fd = src.fileno(), dst.fileno()
        while moved_total < size:
            moved = os.splice(src_fd, write_end, min(CHUNK, size - moved_total), flags=_FLAGS)
            if moved == 0:
                break
            moved_total += moved
            while moved:
                moved -= os.splice(read_end, dst_fd, moved, flags=_FLAGS)
    finally:
        os.close(read_end)
        os.close(write_end)
    return moved_total


def relay(
    client: socket.socket,
    upstream: socket.socket,
    workers: Executor,
    outbound: Callable[[], int],
    counts: list[int] | None = None,
) -> tuple[int, int]:
    """Relay until both directions are done (the way back on a worker thread). `outbound` moves the
    agent's bytes itself (plain HTTP: every request head is read and checked) and returns how many
    it sent. Returns (bytes agent -> upstream, upstream -> agent); `counts`, when given, holds them
    as they move (the way back's at each splice, the agent's once `outbound` returns)."""
    counts = counts if counts is not None else [0, 0]
    for sock in (client, upstream):
        sock.settimeout(None)
    back = workers.submit(_pump, upstream, client, counts, 1)
    try:
        counts[0] += outbound()
    except OSError:
        end_both(client, upstream)  # one side reset, as _pump does
    finally:
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)
    back.result()
    return counts[0], counts[1]


class Way:
    """One direction of a spliced relay: `head` (bytes already read) sent first, then src spliced into a
    pipe and the pipe into dst."""

    def __init__(self, src: socket.socket, dst: socket.socket, head: bytes = b"") -> None:
        self.src, self.dst = src, dst
        self.head = head
        self.read_end, self.write_end = take_pipe()
        self.in_pipe = 0  # read from src, not yet written to dst
        self.reading = True  # src has not ended
        self.moved = 0

    def step(self) -> None:
        """Move what can be moved now without blocking. Once the pipe is drained it returns to poll
        rather than try a read that would mostly find nothing. At src's end, once all of it is in
        dst, dst is shut for writing. OSError: a side reset."""
        if self.head:
            while self.head:
                try:
                    sent = self.dst.send(self.head)
                except BlockingIOError:
                    return  # dst is full: wait until it can take more
                self.head = self.head[sent:]
                self.moved += sent
            return  # src's next bytes usually follow an answer: poll for them
        while self.in_pipe:
            try:
                self.in_pipe -= os.splice(self.read_end, self.dst.fileno(), self.in_pipe, flags=_NONBLOCK)
            except BlockingIOError:
                return
            if not self.in_pipe:
                return
        if not self.reading:
            return
        try:
            moved = os.splice(self.src.fileno(), self.write_end, CHUNK, flags=_NONBLOCK)
        except BlockingIOError:
            if not at_urgent_mark(self.src):
                return  # nothing to read now
            # splice never reads past TCP urgent data, and poll goes on saying what follows it is
            # readable: recv steps over the urgent byte (not part of the stream) and reads on.
            try:
                self.head = self.src.recv(CHUNK)
            except BlockingIOError:
                return  # the urgent byte was all there was
            if self.head:
                self.step()
                return
            moved = 0
        if moved == 0:
            self.reading = False
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)
            return
        self.in_pipe += moved
        self.moved += moved
        self.step()

    def wants(self) -> tuple[int, int] | None:
        """The descriptor and poll event this direction waits for (None: it is done)."""
        if self.head or self.in_pipe:
            return self.dst.fileno(), select.POLLOUT
        if self.reading:
            return self.src.fileno(), select.POLLIN
        return None

    def close(self) -> None:
        give_back(self.read_end, self.write_end, self.in_pipe == 0)


def nonblocking_splice(src_fd: int, dst_fd: int, size: int) -> int:
    """One splice(2) that does not wait (BlockingIOError: nothing to move now)."""
    return os.splice(src_fd, dst_fd, size, flags=_NONBLOCK)


def at_urgent_mark(sock: socket.socket) -> bool:
    """Whether the next byte to read is TCP urgent data (splice stops before it)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCATMARK, b"\0\0\0\0"))[0] == 1
    except OSError:
        return False


def take_pipe() -> tuple[int, int]:
    """An empty pipe for a relay: a kept one, else a new one."""
    with _kept_lock:
        if _kept:
            return _kept.pop()
    return _new_pipe()


def _new_pipe() -> tuple[int, int]:
    """A pipe as large as one splice moves, when the kernel allows it."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    return read_end, write_end


def give_back(read_end: int, write_end: int, drained: bool) -> None:
    """Keep a pipe for a next connection only if nothing of this one is left in it (the count of
    what went in and out, and the kernel's, agree on empty) and fewer than MAX_KEPT_PIPES are kept;
    else close it."""
    if drained:
        try:
            left = struct.unpack("i", fcntl.ioctl(read_end, _FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            left = -1
        if left == 0:
            with _kept_lock:
                if len(_kept) < MAX_KEPT_PIPES:
                    _kept.append((read_end, write_end))
                    return
    os.close(read_end)
    os.close(write_end)


class Relay:
    """Both directions of a connection whose every byte is spliced, stepped by whoever waits on its
    sockets (relay_here's poll, or the filter's loop): `wanted()` says which descriptors to wait on
    for what, `step()` moves what the ready ones allow. Both sockets are made non-blocking.
    `first`: the agent's bytes already read and checked, sent before anything else; `back`: the
    way back, when it was already being relayed (a client that waited for the server)."""

    def __init__(
        self, client: socket.socket, upstream: socket.socket, first: bytes = b"", back: Way | None = None
    ) -> None:
        self.client, self.upstream = client, upstream
        self.ways: list[Way] = []
        try:
            self.ways.append(Way(client, upstream, first))
            self.ways.append(back if back is not None else Way(upstream, client))
        except BaseException:
            self.close()
            raise
        for sock in (client, upstream):
            sock.setblocking(False)

    def step(self, ready: set[int] | None) -> None:
        """Step each direction whose descriptor is ready (`ready` None: the first round, where only
        the checked first bytes have anything to do). OSError: a side reset (both are then ended)."""
        try:
            for way in self.ways:
                want = way.wants()
                if want is not None and (want[0] in ready if ready is not None else bool(way.head)):
                    way.step()
        except OSError:
            end_both(self.client, self.upstream)
            raise

    def wanted(self) -> dict[int, int]:
        """Descriptor -> poll events to wait for; empty once both directions are done. A reset or
        hang-up shows as an event too: the step it causes reads it."""
        wanted: dict[int, int] = {}
        for way in self.ways:
            want = way.wants()
            if want is not None:
                wanted[want[0]] = wanted.get(want[0], 0) | want[1]
        return wanted

    @property
    def moved(self) -> tuple[int, int]:
        """(bytes agent -> upstream, upstream -> agent)."""
        return (self.ways[0].moved if self.ways else 0), (self.ways[1].moved if len(self.ways) > 1 else 0)

    def close(self) -> None:
        """Give back (or close) the pipes; the sockets are the caller's."""
        for way in self.ways:
            way.close()


def relay_here(client: socket.socket, upstream: socket.socket, first: bytes = b"") -> tuple[int, int]:
    """Relay both directions on the calling thread until both are done: each socket non-blocking,
    poll(2), and a step only for the direction whose socket is ready; splice through a pipe per
    direction. `first`: the agent's bytes already read and checked, sent before anything else.
    Returns (bytes agent -> upstream, upstream -> agent)."""
    try:
        relayed = Relay(client, upstream, first)
    except OSError:
        end_both(client, upstream)
        return 0, 0
    try:
        return run_relay(relayed)
    finally:
        relayed.close()


def run_relay(relayed: Relay) -> tuple[int, int]:
    """Step `relayed` on the calling thread until both directions are done (relay_here's loop; its
    pipes are the caller's to close). Its `moved` shows the bytes as they move."""
    client, upstream = relayed.client, relayed.upstream
    try:
        poller = select.poll()
        registered: dict[int, int] = {}
        ready: set[int] | None = None
        while True:
            relayed.step(ready)
            wanted = relayed.wanted()
            if not wanted:
                break
            for fd in registered.keys() - wanted.keys():
                poller.unregister(fd)
            for fd, mask in wanted.items():
                if registered.get(fd) != mask:
                    poller.register(fd, mask)  # registers, or modifies a registered fd
            registered = wanted
            ready = {fd for fd, _ in poller.poll()}
    except OSError:
        end_both(client, upstream)  # one side reset, as _pump does
    return relayed.moved


def end_both(client: socket.socket, upstream: socket.socket) -> None:
    """End both directions of a relayed connection."""
    for sock in (client, upstream):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
