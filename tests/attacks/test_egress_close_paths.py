"""Every way a relayed connection can end on the filter's loop writes exactly one net.close with the
bytes each way: a reset by the agent in the middle of the relay (opaque or plain HTTP), and a
connection still open when the filter stops."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from typing import Any

import pytest

from enforcer.egress.relay import Relay

from ..unit.test_egress_process import wait_for
from .test_egress_loop import GOOD, PORT, WEB, Loopside, loopside, ping, read_answer, records  # noqa: F401


def reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def closes(side: Loopside) -> list[dict[str, Any]]:
    return [r for r in records(side) if r["kind"] == "net.close"]


def test_an_opaque_relay_reset_by_the_agent_is_closed_once_with_its_bytes(loopside: Loopside) -> None:  # noqa: F811
    client = loopside.connect(GOOD)
    assert ping(client) == b"PONG\n"
    client.sendall(b"more")
    got = b""
    while len(got) < 4:
        got += client.recv(16)
    reset(client)
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    [closing] = closes(loopside)
    assert (closing["bytes_out"], closing["bytes_in"]) == (len(b"PING\nmore"), len(b"PONG\nmore"))


def test_a_plain_http_connection_reset_after_an_answer_is_closed_once(loopside: Loopside) -> None:  # noqa: F811
    client = loopside.connect(WEB)
    request = b"GET /one HTTP/1.1\r\nHost: web.example.test\r\n\r\n"
    client.sendall(request)
    answer = read_answer(client)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    reset(client)
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    [closing] = closes(loopside)
    assert closing["requests"] == 1 and closing["bytes_out"] == len(request)
    assert closing["bytes_in"] == len(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def test_connections_open_at_stop_are_closed_once_with_their_bytes(loopside: Loopside) -> None:  # noqa: F811
    opaque = loopside.connect(GOOD)
    web = loopside.connect(WEB)
    try:
        assert ping(opaque) == b"PONG\n"
        request = b"GET /one HTTP/1.1\r\nHost: web.example.test\r\n\r\n"
        web.sendall(request)
        assert read_answer(web).startswith(b"HTTP/1.1 200 OK")
        loopside.stop()
    finally:
        opaque.close()
        web.close()
    written = closes(loopside)
    assert len(written) == 2, written
    by_host = {r["host"]: r for r in written}
    assert (by_host[GOOD]["bytes_out"], by_host[GOOD]["bytes_in"]) == (5, 5)
    assert by_host[WEB]["bytes_out"] == len(request) and by_host[WEB]["requests"] == 1


class Resetting:
    """A server that answers a line with `answer`, then resets the connection."""

    def __init__(self, address: str, answer: bytes) -> None:
        self.listener = socket.create_server((address, PORT))
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):  # the test ended first
            conn, _ = self.listener.accept()
            conn.settimeout(10)
            got = b""
            while b"\n" not in got and (chunk := conn.recv(4096)):
                got += chunk
            conn.sendall(self.answer)
            time.sleep(0.2)  # the answer relayed before the reset
            reset(conn)

    def close(self) -> None:
        self.listener.close()


def test_a_relay_reset_by_the_server_is_closed_once_with_its_bytes(loopside: Loopside) -> None:  # noqa: F811
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    server = Resetting(address, b"PONG\n" + b"x" * 100_000)
    loopside.setup.connections.resolver.zone[GOOD] = [address]  # type: ignore[attr-defined]
    try:
        client = loopside.connect(GOOD)
        client.sendall(b"PING\n")
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := client.recv(65536):
                got += chunk
        client.close()
        wait_for(lambda: loopside.setup.server.handlers.value == 0)
        loopside.stop()
    finally:
        server.close()
    [closing] = closes(loopside)
    assert closing["bytes_out"] == 5 and len(got) <= closing["bytes_in"] <= len(server.answer)


def test_a_plain_http_upload_reset_mid_body_is_closed_once(loopside: Loopside) -> None:  # noqa: F811
    client = loopside.connect(WEB)
    client.sendall(b"POST /up HTTP/1.1\r\nHost: web.example.test\r\nContent-Length: 100000\r\n\r\n" + b"y" * 5000)
    time.sleep(0.3)
    reset(client)
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    written = records(loopside)
    closing = [r for r in written if r["kind"] == "net.close"]
    assert len(closing) == 1
    web = loopside.web  # type: ignore[attr-defined]
    wait_for(lambda: len(web.received) == 1)
    assert closing[0]["bytes_out"] == len(web.received[0])


def test_a_relay_step_that_fails_after_moving_bytes_still_counts_them(
    loopside: Loopside,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure in the middle of a relay (a bug, an error no step expected) refuses the connection:
    the bytes it already moved are still recorded in its net.close and counted in the summary."""
    failing = threading.Event()
    step = Relay.step

    def step_or_fail(self: Relay, ready: set[int] | None) -> None:
        if failing.is_set():
            raise ValueError("a step that fails")
        step(self, ready)

    monkeypatch.setattr(Relay, "step", step_or_fail)
    client = loopside.connect(GOOD)
    try:
        assert ping(client) == b"PONG\n"
        failing.set()
        client.sendall(b"more")
        with contextlib.suppress(ConnectionResetError):
            while client.recv(64):
                pass
    finally:
        client.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    summary = loopside.stop()
    written = records(loopside)
    [refused] = [r for r in written if r.get("decision") == "deny"]
    assert refused["rules"] == ["net.filter_error"]
    [closing] = [r for r in written if r["kind"] == "net.close"]
    assert (closing["bytes_out"], closing["bytes_in"]) == (5, 5)
    assert (summary["connections"]["bytes_out"], summary["connections"]["bytes_in"]) == (5, 5)
