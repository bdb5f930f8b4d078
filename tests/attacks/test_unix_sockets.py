"""Pathname unix sockets from inside a real sandbox. socket(AF_UNIX) is denied because Landlock does
not cover connecting to a pathname socket; a datagram socketpair can address one as well (sendto, or
connect again), so it must be refused too, while stream and seqpacket socketpairs (asyncio's
self-pipe, multiprocessing), which are connected for good, keep working."""

from __future__ import annotations

import contextlib
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

from ..helpers.sandbox import PROBE_CHECK, Sandbox, needs_root

pytestmark = needs_root

PROBE = (
    PROBE_CHECK
    + """
where = os.environ["ALLOWED_HOST_SOCKETS"]
def datagram_sendto():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"FROM-THE-AGENT sendto", where + "/dgram.sock")
def datagram_connect():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    a.connect(where + "/dgram.sock")
    a.send(b"FROM-THE-AGENT connect")
check("datagram socketpair sendto", datagram_sendto)
check("datagram socketpair connect", datagram_connect)
for kind, name in ((socket.SOCK_STREAM, "stream"), (socket.SOCK_SEQPACKET, "seqpacket")):
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    for call, args in (("connect", ()), ("sendto", (b"FROM-THE-AGENT",))):
        try:  # connected for good: EISCONN, or the bytes go to the pair's own peer
            getattr(a, call)(*args, where + "/" + name + ".sock")
        except OSError:
            pass
    c, d = socket.socketpair(socket.AF_UNIX, kind)
    c.sendall(b"ping")
    print("PAIR", name, d.recv(4).decode())
import asyncio  # its event loop wakes itself through a stream socketpair
print("ASYNCIO", asyncio.run(asyncio.sleep(0, result="runs")))
"""
)


@contextlib.contextmanager
def host_sockets(directory: Path) -> Iterator[dict[str, socket.socket]]:
    """A host service's sockets (like journald's or syslog's) outside the agent's grants, writable by
    every uid, as such sockets are."""
    servers: dict[str, socket.socket] = {}
    try:
        for name, kind in (
            ("dgram", socket.SOCK_DGRAM),
            ("stream", socket.SOCK_STREAM),
            ("seqpacket", socket.SOCK_SEQPACKET),
        ):
            server = servers[name] = socket.socket(socket.AF_UNIX, kind)
            server.bind(str(directory / f"{name}.sock"))
            (directory / f"{name}.sock").chmod(0o777)
            if kind != socket.SOCK_DGRAM:
                server.listen()
            server.setblocking(False)
        yield servers
    finally:
        for server in servers.values():
            server.close()


def received(servers: dict[str, socket.socket]) -> list[bytes]:
    got: list[bytes] = []
    with contextlib.suppress(BlockingIOError):
        for _ in range(10):
            got.append(servers["dgram"].recv(200))
    for name in ("stream", "seqpacket"):
        with contextlib.suppress(BlockingIOError):
            conn, _ = servers[name].accept()
            conn.close()
            got.append(f"a {name} connection".encode())
    return got


def test_a_socketpair_cannot_reach_a_host_unix_socket(sandbox: Sandbox) -> None:
    sandbox.outside.chmod(0o711)  # the agent's uid may look the sockets up, as in /run or /dev
    with host_sockets(sandbox.outside) as servers:
        result = sandbox.python(textwrap.dedent(PROBE), env={"ALLOWED_HOST_SOCKETS": str(sandbox.outside)})
        got = received(servers)
    assert "ESCAPED" not in result.out, result.out + result.err
    assert result.out.count("BLOCKED") == 2, result.out + result.err
    assert got == [], got
    # control: the connected socketpairs still work
    assert "PAIR stream ping" in result.out and "PAIR seqpacket ping" in result.out, result.out + result.err
    assert "ASYNCIO runs" in result.out, result.out + result.err
