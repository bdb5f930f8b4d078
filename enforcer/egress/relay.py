"""Moving bytes between the agent's socket and the upstream socket: splice(2) through a pipe, so the
bytes never enter Python (one thread per direction; the GIL is released inside splice). Only what
the filter must read passes through Python: a connection's first message and plain-HTTP heads."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from concurrent.futures import Executor

CHUNK = 1 << 20
_PIPE_SIZE = 1 << 20
_FLAGS = os.SPLICE_F_MOVE  # not SPLICE_F_MORE: it corks the socket, delaying a small request


def _pump(src: socket.socket, dst: socket.socket, counter: list[int], index: int) -> None:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
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
        # One side reset: end both directions (shutdown wakes the other thread's blocking splice).
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
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
    outbound: Callable[[], int] | None = None,
    first: bytes = b"",
) -> tuple[int, int]:
    """Relay until both directions are done (the way back on a worker thread). `first`: the agent's
    bytes already read and checked, sent before anything else. `outbound`, when given, moves the
    agent's other bytes itself (plain HTTP: every request head is read and checked) and returns how
    many it sent. Returns (bytes agent -> upstream, upstream -> agent)."""
    counts = [0, 0]
    for sock in (client, upstream):
        sock.settimeout(None)
    if first:
        # Out before the way back is set up: the request does not wait for a worker thread to
        # wake, and the answer waits in the socket until the pump reads it.
        try:
            upstream.sendall(first)
            counts[0] = len(first)
        except OSError:
            for sock in (client, upstream):  # one side reset: end both directions, as _pump does
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
    back = workers.submit(_pump, upstream, client, counts, 1)
    if outbound is None:
        _pump(client, upstream, counts, 0)
    else:
        try:
            counts[0] += outbound()
        except OSError:
            for sock in (client, upstream):  # one side reset: end both directions, as _pump does
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        finally:
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
    back.result()
    return counts[0], counts[1]
