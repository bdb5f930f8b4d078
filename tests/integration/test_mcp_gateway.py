"""adl-mcp between a real MCP client and a real MCP server (both the `mcp` SDK), with a real daemon."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import TOOLS, RunningDaemon, daemon  # noqa: F401 (fixture)
from ..helpers.sandbox import AGENT_UID

AGENT = "Gateway"

# The MCP server: read_note, pay and delete_note are declared in the agent's ADL document;
# shell is not. Every call it sees is appended to SEEN, so a test can tell what got through.
SERVER = textwrap.dedent(
    """
    import json, os, sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("notes")
    SEEN = os.environ["SEEN"]

    def seen(tool, **arguments):
        with open(SEEN, "a") as f:
            f.write(json.dumps({"tool": tool, "arguments": arguments}) + "\\n")

    @server.tool()
    def read_note(name: str, count: int = 1) -> str:
        seen("read_note", name=name, count=count)
        return f"note {name} x{count}"

    @server.tool()
    def pay(amount: float) -> str:
        seen("pay", amount=amount)
        return f"paid {amount}"

    @server.tool()
    def delete_note(name: str) -> str:
        seen("delete_note", name=name)
        return f"deleted {name}"

    @server.tool()
    def shell(command: str) -> str:
        seen("shell", command=command)
        return "ran"

    if os.environ.get("PORT"):
        server.run("streamable-http", host="127.0.0.1", port=int(os.environ["PORT"]))
    else:
        server.run()
    """
)


@pytest.fixture
def gateway_daemon(daemon: RunningDaemon) -> Iterator[RunningDaemon]:  # noqa: F811
    daemon.write_adl("gateway", AGENT, {})
    daemon.admin_stub().ReloadPolicies(pb.ReloadRequest())
    yield daemon


def _seen(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _gateway_params(d: RunningDaemon, tmp_path: Path, *extra: str) -> StdioServerParameters:
    server = tmp_path / "notes_server.py"
    server.write_text(SERVER)
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "enforcer.integrations.mcp_gateway",
            "--agent",
            AGENT,
            "--socket",
            f"unix:{d.api}",
            *extra,
            "--",
            sys.executable,
            str(server),
        ],
        env={**os.environ, "SEEN": str(tmp_path / "seen.jsonl")},
    )


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _approve_when_pending(d: RunningDaemon, approved: list[str], stop: threading.Event) -> None:
    admin = d.admin_stub()
    deadline = time.monotonic() + 20
    while not stop.is_set() and time.monotonic() < deadline:
        pending = admin.ListPending(pb.ListPendingRequest(agent=AGENT)).pending
        if pending:
            stop.wait(1.5)  # long enough for the gateway to report progress while it waits
            admin.Approve(pb.ApprovalDecision(approval_id=pending[0].approval_id, approver="alice"))
            approved.append(pending[0].decision_id)
            return
        time.sleep(0.05)


def test_gateway_lists_declared_tools_checks_every_call_and_audits(
    gateway_daemon: RunningDaemon, tmp_path: Path
) -> None:
    d = gateway_daemon
    seen_file = tmp_path / "seen.jsonl"
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with stdio_client(_gateway_params(d, tmp_path)) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            out["listed"] = sorted(t.name for t in (await client.list_tools()).tools)
            out["allowed"] = await client.call_tool("read_note", {"name": "todo", "count": 2})
            out["undeclared"] = await client.call_tool("shell", {"command": "id"})
            out["bad_args"] = await client.call_tool("read_note", {"name": 7})
            out["seen_before_ask"] = _seen(seen_file)
            stop = threading.Event()
            approved: list[str] = []
            approver = threading.Thread(target=_approve_when_pending, args=(d, approved, stop))
            approver.start()
            try:
                out["asked"] = await client.call_tool("delete_note", {"name": "old"}, progress_callback=on_progress)
            finally:
                stop.set()
                approver.join(10)
            out["approved"] = approved
        return out

    out = anyio.run(run)

    assert out["listed"] == ["delete_note", "pay", "read_note"]  # shell is hidden
    allowed = out["allowed"]
    assert not allowed.is_error and _text(allowed) == "note todo x2"
    allowed_id = allowed.meta["adl-enforcer/decision"]["decision_id"]

    undeclared = out["undeclared"]
    assert undeclared.is_error and "tool.undeclared" in _text(undeclared)
    bad = out["bad_args"]
    assert bad.is_error and "refused read_note" in _text(bad)
    bad_rules = bad.meta["adl-enforcer/decision"]["rules"]
    assert bad_rules == ["tool.args_invalid"]
    # The server saw only the allowed call: not the undeclared tool, not the arguments that broke the schema.
    assert out["seen_before_ask"] == [{"tool": "read_note", "arguments": {"name": "todo", "count": 2}}]

    asked = out["asked"]
    assert not asked.is_error and _text(asked) == "deleted old", _text(asked)
    assert out["approved"] and asked.meta["adl-enforcer/decision"]["decision"] == "ALLOW"
    assert progress and "waiting for approval" in (progress[0][2] or "")
    assert _seen(seen_file)[-1] == {"tool": "delete_note", "arguments": {"name": "old"}}

    records = d.records()
    by_id = {r["payload"]["decision_id"]: r for r in records if r["intent"].endswith(".decision")}
    assert by_id[allowed_id]["payload"]["decision"] == "allow"
    for refused in (undeclared, bad):
        decision_id = refused.meta["adl-enforcer/decision"]["decision_id"]
        assert by_id[decision_id]["payload"]["decision"] == "deny"
    assert by_id[out["approved"][0]]["payload"]["decision"] == "ask"
    outcomes = [r["payload"].get("outcome") for r in records if r["intent"].endswith(".approval")]
    assert outcomes == ["approved"]


def test_gateway_refuses_an_ask_nobody_approves_within_the_bound(gateway_daemon: RunningDaemon, tmp_path: Path) -> None:
    d = gateway_daemon

    async def run() -> types.CallToolResult:
        params = _gateway_params(d, tmp_path, "--approval-wait", "1")
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            return await client.call_tool("delete_note", {"name": "old"})

    started = time.monotonic()
    result = anyio.run(run)
    assert result.is_error and "no approval within 1 s" in _text(result)
    assert time.monotonic() - started < 15
    assert _seen(tmp_path / "seen.jsonl") == []


def test_gateway_fails_closed_when_the_daemon_is_gone(gateway_daemon: RunningDaemon, tmp_path: Path) -> None:
    d = gateway_daemon

    async def run() -> tuple[list[str], types.CallToolResult]:
        async with stdio_client(_gateway_params(d, tmp_path)) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            d.stop()
            listed = [t.name for t in (await client.list_tools()).tools]
            return listed, await client.call_tool("read_note", {"name": "todo"})

    listed, result = anyio.run(run)
    assert listed == []
    assert result.is_error and "client.error" in _text(result)
    assert _seen(tmp_path / "seen.jsonl") == []


BOXED_SERVER = textwrap.dedent(
    """
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("files")

    @server.tool()
    def read_note(name: str) -> str:
        try:
            with open(name) as f:
                return f.read()
        except OSError as exc:
            return f"{type(exc).__name__}: {exc.strerror}"

    server.run()
    """
)


def test_gateway_starts_the_server_under_adl_exec(daemon: RunningDaemon, tmp_path: Path) -> None:  # noqa: F811
    """--sandbox: the server's own file access is the agent's, not the gateway's."""
    box = daemon.box
    server = box.ref / "files_server.py"
    # The server runs as the agent identity, which cannot reach every interpreter's home (a
    # pyenv's under /root): the system's python3, with this environment's packages on its path.
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python3 for the sandboxed server")
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    server.write_text(f"import sys\nsys.path.insert(0, {site!r})\n" + BOXED_SERVER)
    runtime = sorted({sys.prefix, str(Path(__file__).resolve().parents[2])})
    # Only the baseline's library trees may hold loadable C extensions (every other mount is
    # noexec): the operator lists a virtual environment's there, as this daemon's baseline does.
    from enforcer import data

    baseline = tmp_path / "baseline.yaml"
    text = data.RUNTIME_BASELINE.read_text()
    assert "\nlibrary_trees:\n" in text
    baseline.write_text(text.replace("\nlibrary_trees:\n", f"\nlibrary_trees:\n  - {site}\n", 1))
    daemon.stop()
    daemon.extra_env["ADL_ENFORCER_BASELINE"] = str(baseline)
    daemon.start()
    permissions = {
        "filesystem": {
            "allowed_paths": [
                {"path": f"{box.ws}/**", "access": "read_write"},
                {"path": f"{box.ref}/**", "access": "read"},
                *({"path": f"{p}/**", "access": "read"} for p in runtime),
            ],
        },
        "execution": {
            "allowed_commands": [system_python, os.path.realpath(system_python)],
            "allow_shell": False,
        },
        "resource_limits": {"max_memory_mb": 512, "max_cpu_percent": 100, "max_duration_sec": 120},
    }
    daemon.write_adl("boxed", "Boxed Gateway", permissions)
    daemon.admin_stub().ReloadPolicies(pb.ReloadRequest())

    async def run() -> tuple[str, str]:
        params = StdioServerParameters(
            command=sys.executable,
            args=[
                "-m",
                "enforcer.integrations.mcp_gateway",
                "--agent",
                "Boxed Gateway",
                "--socket",
                f"unix:{daemon.api}",
                "--sandbox",
                "--launch-socket",
                str(daemon.launch),
                "--sandbox-user",  # the daemon launches no agent for a root caller
                str(AGENT_UID),
                "--",
                system_python,
                str(server),
            ],
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            inside = await client.call_tool("read_note", {"name": str(box.ws / "notes.txt")})
            outside = await client.call_tool("read_note", {"name": str(box.outside / "private.txt")})
            return _text(inside), _text(outside)

    inside, outside = anyio.run(run)
    assert inside == "workspace notes\n"
    assert outside.startswith("PermissionError"), outside  # Landlock, inside the server's own process
    launched = [r for r in daemon.records() if r["intent"] == "adl.enforcer.launch"]
    assert len(launched) == 1 and str(server) in json.dumps(launched[0]["payload"]), launched


def test_gateway_over_streamable_http(gateway_daemon: RunningDaemon, tmp_path: Path) -> None:
    from mcp.client.streamable_http import streamable_http_client

    d = gateway_daemon
    port = _free_port()
    params = _gateway_params(d, tmp_path, "--http", f"127.0.0.1:{port}")
    gateway = subprocess.Popen([params.command, *params.args], env=params.env, stderr=subprocess.PIPE)
    try:
        _wait_listening(gateway, port)

        async def run() -> tuple[list[str], types.CallToolResult, types.CallToolResult]:
            async with (
                streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                listed = sorted(t.name for t in (await client.list_tools()).tools)
                allowed = await client.call_tool("read_note", {"name": "todo"})
                refused = await client.call_tool("pay", {"amount": "all of it"})
                return listed, allowed, refused

        listed, allowed, refused = anyio.run(run)
    finally:
        gateway.terminate()
        try:
            gateway.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait(timeout=5)
    assert listed == ["delete_note", "pay", "read_note"]
    assert _text(allowed) == "note todo x1"
    assert refused.is_error and "tool.args_invalid" in _text(refused)
    assert _seen(tmp_path / "seen.jsonl") == [{"tool": "read_note", "arguments": {"name": "todo", "count": 1}}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, "nothing listens"
        time.sleep(0.05)


def test_gateway_in_front_of_a_server_that_speaks_streamable_http(
    gateway_daemon: RunningDaemon, tmp_path: Path
) -> None:
    d = gateway_daemon
    server_file = tmp_path / "notes_server.py"
    server_file.write_text(SERVER)
    port = _free_port()
    env = {**os.environ, "SEEN": str(tmp_path / "seen.jsonl"), "PORT": str(port)}
    server = subprocess.Popen([sys.executable, str(server_file)], env=env, stderr=subprocess.PIPE)
    try:
        _wait_listening(server, port)
        params = StdioServerParameters(
            command=sys.executable,
            args=[
                "-m",
                "enforcer.integrations.mcp_gateway",
                "--agent",
                AGENT,
                "--socket",
                f"unix:{d.api}",
                "--upstream",
                f"http://127.0.0.1:{port}/mcp",
            ],
        )

        async def run() -> tuple[list[str], types.CallToolResult, types.CallToolResult]:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                listed = sorted(t.name for t in (await client.list_tools()).tools)
                return listed, await client.call_tool("read_note", {"name": "n"}), await client.call_tool("shell", {})

        listed, allowed, refused = anyio.run(run)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
    assert listed == ["delete_note", "pay", "read_note"]
    assert _text(allowed) == "note n x1" and refused.is_error and "tool.undeclared" in _text(refused)
    assert _seen(tmp_path / "seen.jsonl") == [{"tool": "read_note", "arguments": {"name": "n", "count": 1}}]


def test_http_beyond_loopback_needs_an_explicit_flag() -> None:
    """The gateway has no authentication: listening beyond loopback is the operator's explicit choice."""
    argv = [sys.executable, "-m", "enforcer.integrations.mcp_gateway", "--agent", AGENT]
    refused = subprocess.run(
        [*argv, "--http", "0.0.0.0:8765", "--", "true"], capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 2 and "--http-remote" in refused.stderr
    refused = subprocess.run([*argv, "--http", "[::]:8765", "--", "true"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "not loopback" in refused.stderr


SECOND_SERVER = textwrap.dedent(
    """
    import json, os
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("archive")

    def seen(tool, **arguments):
        with open(os.environ["SEEN"], "a") as f:
            f.write(json.dumps({"tool": tool, "arguments": arguments, "server": "second"}) + "\\n")

    @server.tool()
    def archive_note(name: str) -> str:
        seen("archive_note", name=name)
        return f"archived {name}"

    @server.tool()
    def pay(amount: float) -> str:
        seen("pay", amount=amount)
        return "paid twice?"

    server.run()
    """
)


def test_gateway_serves_several_servers_and_refuses_a_name_two_offer(daemon: RunningDaemon, tmp_path: Path) -> None:  # noqa: F811
    archive = {"name": "archive_note", "description": "archive", "parameters": {"type": "object"}}
    daemon.write_adl("gateway", AGENT, {}, tools=[*TOOLS, archive])
    daemon.admin_stub().ReloadPolicies(pb.ReloadRequest())
    second = tmp_path / "archive_server.py"
    second.write_text(SECOND_SERVER)
    params = _gateway_params(daemon, tmp_path, "--server", f"{sys.executable} {second}")

    async def run() -> tuple[list[str], dict[str, types.CallToolResult]]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            listed = sorted(t.name for t in (await client.list_tools()).tools)
            calls = {
                "archive_note": await client.call_tool("archive_note", {"name": "old"}),
                "read_note": await client.call_tool("read_note", {"name": "new"}),
                "pay": await client.call_tool("pay", {"amount": 5}),
            }
            return listed, calls

    listed, calls = anyio.run(run)
    assert listed == ["archive_note", "delete_note", "read_note"]  # pay: offered by both, hidden
    assert _text(calls["archive_note"]) == "archived old" and _text(calls["read_note"]) == "note new x1"
    assert calls["pay"].is_error and "no single server offers it" in _text(calls["pay"])
    assert _seen(tmp_path / "seen.jsonl") == [
        {"tool": "archive_note", "arguments": {"name": "old"}, "server": "second"},
        {"tool": "read_note", "arguments": {"name": "new", "count": 1}},
    ]
