"""A web page the user opens rebinds its own name to the loopback address `adl-mcp --http` listens
on: the browser then sends the page's requests there as same-origin, with the page's name as Host.
The gateway has no authentication of its own, so whoever gets through acts as the agent. The SDK
checks Host and Origin only for 127.0.0.1, localhost and ::1; every loopback address the gateway
accepts must be checked the same way."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

SERVER = textwrap.dedent(
    """
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("notes")

    @server.tool()
    def read_note(name: str) -> str:
        return name

    server.run()
    """
)
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}},
    }
)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _post(host: str, port: int, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request(
            "POST",
            "/mcp",
            body=INITIALIZE,
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
        )
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.45.6.7"])
def test_a_rebound_name_is_refused_on_every_loopback_address(tmp_path: Path, host: str) -> None:
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    port = _free_port(host)
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enforcer.integrations.mcp_gateway",
            "--agent",
            "Gateway",
            "--socket",
            f"unix:{tmp_path / 'no-daemon.sock'}",  # initialize does not need the daemon
            "--http",
            f"{host}:{port}",
            "--",
            sys.executable,
            str(server),
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert gateway.poll() is None, gateway.stderr.read() if gateway.stderr else ""
            with socket.socket() as probe:
                if probe.connect_ex((host, port)) == 0:
                    break
            assert time.monotonic() < deadline, "nothing listens"
            time.sleep(0.05)
        page = f"rebind.attacker.example:{port}"
        assert _post(host, port, {"Host": page, "Origin": f"http://{page}"}) == 421
        assert _post(host, port, {"Host": f"{host}:{port}", "Origin": "http://attacker.example"}) == 403
        assert _post(host, port, {"Host": f"{host}:{port}"}) == 200  # the address itself is served
    finally:
        gateway.terminate()
        try:
            gateway.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()
