"""Pathname unix sockets from inside a real sandbox. socket(AF_UNIX) is denied because Landlock does
not cover connecting to a pathname socket; a datagram socketpair can address one as well (sendto, or
connect again), so it must be refused too, while stream socketpairs (asyncio's self-pipe,
multiprocessing) keep working."""

from __future__ import annotations

import contextlib
import os
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..sandbox_helpers import Sandbox, needs_root

pytestmark = needs_root

PROBE = """
import os, socket
target = os.environ["ALLOWED_HOST_SOCKET"]
def check(label, fn):
    try:
        fn()
        print("ESCAPED", label)
    except OSError as exc:
        print("BLOCKED", label, exc.errno)
def sendto():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"FROM-THE-AGENT sendto", target)
def reconnect():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    a.connect(target)
    a.send(b"FROM-THE-AGENT connect")
check("datagram socketpair sendto", sendto)
check("datagram socketpair connect", reconnect)
a, b = socket.socketpair()
a.sendall(b"ping")
print("STREAM PAIR", b.recv(4).decode())
"""


@contextlib.contextmanager
def host_datagram_socket(directory: Path) -> Iterator[socket.socket]:
    """A host service's datagram socket (like journald's or syslog's) outside the agent's grants,
    writable by every uid, as such sockets are."""
    path = directory / "host-service.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        server.bind(str(path))
        path.chmod(0o777)
        server.setblocking(False)
        yield server
    finally:
        server.close()
        path.unlink(missing_ok=True)


def test_a_datagram_socketpair_cannot_reach_a_host_unix_socket(sandbox: Sandbox) -> None:
    sandbox.outside.chmod(0o711)  # the agent's uid may look the socket up, as in /run or /dev
    with host_datagram_socket(sandbox.outside) as server:
        path = sandbox.outside / "host-service.sock"
        result = sandbox.python(textwrap.dedent(PROBE), env={"ALLOWED_HOST_SOCKET": str(path)})
        received = []
        with contextlib.suppress(BlockingIOError):
            for _ in range(10):
                received.append(server.recv(200))
    assert "ESCAPED" not in result.out, result.out + result.err
    assert result.out.count("BLOCKED") == 2, result.out + result.err
    assert received == [], received
    # control: stream socketpairs, which cannot address anything, still work
    assert "STREAM PAIR ping" in result.out, result.out + result.err


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_SEQPACKET])
def test_connected_socketpairs_cannot_address_a_host_socket(kind: int) -> None:
    """Why stream and seqpacket socketpairs may stay: a connected socket of those types can neither
    connect again nor send to an address (checked on the host, no sandbox needed)."""
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    try:
        with pytest.raises(OSError):
            a.connect("\0adl-test-" + os.urandom(4).hex())
        with pytest.raises(OSError):
            a.sendto(b"x", "\0adl-test-" + os.urandom(4).hex())
    finally:
        a.close()
        b.close()
