"""TCP urgent data on a spliced connection.

splice(2) from a TCP socket stops before an urgent byte and never passes it, while poll(2) goes on
reporting the bytes after it as readable. The agent (or an allowed host answering it) sends one byte
with MSG_OOB and then more: the relay that handles the connection must neither spin on it (each
such connection would hold a core and the filter's other threads behind it) nor stop relaying what
follows it.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from enforcer.egress.relay import relay_here


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(connecting side, accepted side) of one loopback TCP connection: urgent data needs TCP."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


def _read_until(sock: socket.socket, wanted: bytes, limit_s: float) -> bytes:
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + limit_s
    while wanted not in got and time.monotonic() < deadline:
        try:
            chunk = sock.recv(1000)
        except TimeoutError:
            continue
        if not chunk:
            break
        got += chunk
    return got


def _relay_with_urgent_byte(from_agent: bool) -> tuple[bytes, float, bool]:
    """What reached the far side after an urgent byte, the relaying thread's CPU seconds over one
    second with that byte pending, and whether the relay ended once both sides closed."""
    agent, client = _tcp_pair()
    upstream, server = _tcp_pair()
    relaying = threading.Thread(target=relay_here, args=(client, upstream, b"first "), daemon=True)
    relaying.start()
    sender, receiver = (agent, server) if from_agent else (server, agent)
    try:
        if from_agent:
            assert _read_until(server, b"first ", 5) == b"first "
        sender.sendall(b"before ")
        assert _read_until(receiver, b"before ", 5).endswith(b"before ")
        sender.send(b"!", socket.MSG_OOB)
        sender.sendall(b"after")
        got = _read_until(receiver, b"after", 1.0)
        time.sleep(1.0)  # the byte is pending (or passed): a spinning relay burns this second
        alive_cpu = _thread_cpu(relaying)
    finally:
        for sock in (agent, server):
            sock.close()
        relaying.join(5)
        for sock in (client, upstream):
            sock.close()
    return got, alive_cpu, not relaying.is_alive()


def _thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds the (still running) thread has used, from /proc."""
    assert thread.native_id is not None
    with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def test_an_urgent_byte_from_the_agent_neither_spins_the_relay_nor_stops_it() -> None:
    got, cpu, ended = _relay_with_urgent_byte(from_agent=True)
    assert got.endswith(b"after"), got  # the bytes after the urgent one were relayed
    assert cpu < 0.3, f"the relay spent {cpu:.2f} s of CPU on a pending urgent byte"
    assert ended


def test_an_urgent_byte_from_upstream_neither_spins_the_relay_nor_stops_it() -> None:
    got, cpu, ended = _relay_with_urgent_byte(from_agent=False)
    assert got.endswith(b"after"), got
    assert cpu < 0.3, f"the relay spent {cpu:.2f} s of CPU on a pending urgent byte"
    assert ended
