"""enforcer/framing.py, written on _socket and int.to_bytes: the frames, descriptors and peer
credentials the socket and struct modules would give."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest

from enforcer.framing import MAX_FRAME, FrameError, peer_credentials, recv_frame, send_frame


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        yield a, b


def test_a_frame_is_its_length_in_network_order_then_the_body(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    send_frame(a, b"hello")
    assert b.recv(100) == struct.pack("!I", 5) + b"hello"
    send_frame(a, b"x" * 70_000)
    assert recv_frame(b) == (b"x" * 70_000, [])


def test_descriptors_travel_with_the_frame(pair: tuple[socket.socket, socket.socket], tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    files = [os.open(tmp_path / name, os.O_CREAT | os.O_RDWR, 0o600) for name in ("one", "two", "three")]
    try:
        send_frame(a, b"with fds", files)
        frame = recv_frame(b, max_fds=4)
        assert frame is not None and frame[0] == b"with fds" and len(frame[1]) == 3
        for sent, received in zip(files, frame[1], strict=True):
            assert (os.fstat(sent).st_ino, os.fstat(sent).st_dev) == (
                os.fstat(received).st_ino,
                os.fstat(received).st_dev,
            )
            # Close-on-exec: an interpreter or guardian this process executes next never holds
            # another session's stdio open.
            assert not os.get_inheritable(received)
            os.close(received)
        # What socket.recv_fds reads from the same message, for comparison.
        send_frame(a, b"again", files[:2])
        head, fds, _flags, _addr = socket.recv_fds(b, 4, 4)
        assert head == struct.pack("!I", 5) and len(fds) == 2 and b.recv(5) == b"again"
        for fd in fds:
            os.close(fd)
    finally:
        for fd in files:
            os.close(fd)


def test_a_frame_over_the_limit_or_cut_short_is_an_error(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    with pytest.raises(FrameError):
        send_frame(a, b"x" * (MAX_FRAME + 1))
    a.sendall(struct.pack("!I", MAX_FRAME + 1))
    with pytest.raises(FrameError, match="exceeds"):
        recv_frame(b)
    a.sendall(struct.pack("!I", 10) + b"short")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(FrameError, match="middle of a message"):
        recv_frame(b)
    assert recv_frame(b) is None  # a clean end of stream


def test_descriptors_of_a_broken_frame_are_closed(pair: tuple[socket.socket, socket.socket], tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR, 0o600)
    before = set(os.listdir("/proc/self/fd"))
    socket.send_fds(a, [struct.pack("!I", 10)], [fd])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(FrameError):
        recv_frame(b, max_fds=1)
    os.close(fd)
    assert set(os.listdir("/proc/self/fd")) <= before


def test_peer_credentials_are_the_kernels(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())
    raw = a.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    assert peer_credentials(a) == struct.unpack("3i", raw)


def test_every_descriptor_received_in_the_package_is_close_on_exec() -> None:
    """Each recv_fds/recvmsg call in enforcer/ asks for MSG_CMSG_CLOEXEC: a process that executes
    another program later (the stage the agent, the launcher its helpers) passes on only what it
    means to."""
    import ast
    from pathlib import Path

    import enforcer

    calls = []
    for path in Path(enforcer.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if call and node.func.attr in {"recv_fds", "recvmsg"}:  # type: ignore[attr-defined]
                calls.append((f"{path.name}:{node.lineno}", "MSG_CMSG_CLOEXEC" in ast.unparse(node)))
    assert len(calls) >= 5 and [where for where, cloexec in calls if not cloexec] == []
