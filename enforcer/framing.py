"""Length-prefixed messages on unix stream sockets, with file descriptors attached (SCM_RIGHTS).

Used by the launch socket (adl-exec <-> daemon) and the spawner channel (daemon <-> spawner).
No gRPC here: the spawner imports this before any gRPC code exists in the process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct

MAX_FRAME = 8 << 20
_HEADER = struct.Struct("!I")


class FrameError(Exception):
    pass


def send_frame(sock: socket.socket, data: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    if len(data) > MAX_FRAME:
        raise FrameError(f"message of {len(data)} bytes exceeds {MAX_FRAME}")
    header = _HEADER.pack(len(data))
    if fds:
        # The descriptors ride on the 4 header bytes; the body follows as plain data.
        socket.send_fds(sock, [header], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(header + data)


def _exactly(sock: socket.socket, size: int, got: bytes = b"") -> bytes:
    chunks = [got]
    have = len(got)
    while have < size:
        chunk = sock.recv(min(size - have, 1 << 20))
        if not chunk:
            raise FrameError("connection closed in the middle of a message")
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[bytes, list[int]] | None:
    """(data, fds), or None on a clean end of stream before a message starts."""
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    else:
        head, fds = sock.recv(_HEADER.size), []
    if not head:
        return None
    try:
        head = _exactly(sock, _HEADER.size, head)
        (size,) = _HEADER.unpack(head)
        if size > MAX_FRAME:
            raise FrameError(f"message of {size} bytes exceeds {MAX_FRAME}")
        return _exactly(sock, size), fds
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
