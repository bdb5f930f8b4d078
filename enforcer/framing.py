"""Length-prefixed messages on unix stream sockets, with file descriptors attached (SCM_RIGHTS).

Used by the launch socket (adl-exec <-> daemon) and the spawner channel (daemon <-> spawner).
No gRPC here: the spawner imports this before any gRPC code exists in the process. Written on
`_socket` and int.to_bytes rather than `socket` and `struct`: `adl-exec --daemon` imports this, and
the `socket` module's enums would be most of its start-up. socket.socket objects work as they are
(they are `_socket.socket`s).
"""

from __future__ import annotations

import _socket
import os
import sys

MAX_FRAME = 8 << 20
_HEADER_SIZE = 4  # the body's length, unsigned 32-bit, network byte order
_FD_SIZE = 4  # a descriptor in SCM_RIGHTS data: a C int, native byte order


class FrameError(Exception):
    pass


def send_frame(sock: _socket.socket, data: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    if len(data) > MAX_FRAME:
        raise FrameError(f"message of {len(data)} bytes exceeds {MAX_FRAME}")
    header = len(data).to_bytes(_HEADER_SIZE, "big")
    if fds:
        # The descriptors ride on the 4 header bytes; the body follows as plain data.
        rights = b"".join(fd.to_bytes(_FD_SIZE, sys.byteorder, signed=True) for fd in fds)
        sock.sendmsg([header], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        sock.sendall(data)
    else:
        sock.sendall(header + data)


def _exactly(sock: _socket.socket, size: int, got: bytes = b"") -> bytes:
    chunks = [got]
    have = len(got)
    while have < size:
        chunk = sock.recv(min(size - have, 1 << 20))
        if not chunk:
            raise FrameError("connection closed in the middle of a message")
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def _recv_fds(sock: _socket.socket, size: int, max_fds: int) -> tuple[bytes, list[int]]:
    """As socket.recv_fds: the data and every whole descriptor of the SCM_RIGHTS messages, each
    close-on-exec (a process this one executes later never inherits another session's stdio)."""
    space = _socket.CMSG_LEN(max_fds * _FD_SIZE)
    head, ancillary, _flags, _addr = sock.recvmsg(size, space, _socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, rights in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            whole = len(rights) - len(rights) % _FD_SIZE
            fds += (
                int.from_bytes(rights[at : at + _FD_SIZE], sys.byteorder, signed=True)
                for at in range(0, whole, _FD_SIZE)
            )
    return head, fds


def recv_frame(sock: _socket.socket, max_fds: int = 0) -> tuple[bytes, list[int]] | None:
    """(data, fds), or None on a clean end of stream before a message starts."""
    if max_fds:
        head, fds = _recv_fds(sock, _HEADER_SIZE, max_fds)
    else:
        head, fds = sock.recv(_HEADER_SIZE), []
    if not head:
        return None
    try:
        head = _exactly(sock, _HEADER_SIZE, head)
        size = int.from_bytes(head, "big")
        if size > MAX_FRAME:
            raise FrameError(f"message of {size} bytes exceeds {MAX_FRAME}")
        return _exactly(sock, size), fds
    except BaseException:
        for fd in fds:
            try:  # noqa: SIM105 (contextlib is not imported on the client's path)
                os.close(fd)
            except OSError:
                pass
        raise


def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel (SO_PEERCRED)."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 3 * 4)
    pid, uid, gid = (int.from_bytes(raw[at : at + 4], sys.byteorder, signed=True) for at in (0, 4, 8))
    return pid, uid, gid
