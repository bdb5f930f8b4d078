"""adl-mcp: an MCP gateway that asks adl-enforcerd before every tools/call.

    adl-mcp --agent "Coding Agent" -- python my_server.py            # the client speaks stdio
    adl-mcp --agent "Coding Agent" --http 127.0.0.1:8765 -- ...       # the client speaks streamable HTTP
    adl-mcp --agent "Coding Agent" --sandbox -- python my_server.py  # the server itself under adl-exec
    adl-mcp --agent "Coding Agent" --upstream http://127.0.0.1:9000/mcp  # a server that speaks HTTP
    adl-mcp --agent "Coding Agent" --server "python a.py" --server "python b.py"  # several servers

The gateway starts the MCP servers (stdio), or connects to them over streamable HTTP, and serves
their tools together to one MCP client. Every tools/call is a Check for the agent the gateway serves:

- ALLOW forwards the call and returns the server's answer;
- DENY answers a tool error (isError) naming the rule, and the server never sees the call;
- ASK waits for an approval (Approve / Reject on the admin socket) up to --approval-wait seconds,
  sending progress notifications when the client gave a progress token, then forwards or refuses.
tools/list shows only the servers' tools that the policy declares (a name two servers offer is
hidden and refused: the policy could not tell them apart). The daemon checks the
arguments against the tool's declared schema before anything is forwarded. Any failure to reach
the daemon is a refusal.

With --sandbox the server runs under `adl-exec --daemon` for the same agent, so its own file,
network and process access is enforced by the kernel, not only its tool calls.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import logging
import math
import os
import pwd
import shlex
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from ..client import AsyncClient, Result, default_address

log = logging.getLogger("adl-mcp")

DEFAULT_APPROVAL_WAIT_S = 300.0
PROGRESS_EVERY_S = 1.0  # how often an ASK that is still pending reports progress
MAX_PAGES = 100  # tools/list pages read from one server


@dataclass(frozen=True)
class GatewayConfig:
    agent: str
    servers: Sequence[Sequence[str]]  # the MCP servers' command lines
    address: str = ""  # the daemon's API socket (default: ADL_ENFORCER_SOCKET)
    approval_wait_s: float = DEFAULT_APPROVAL_WAIT_S
    sandbox: bool = False
    launch_socket: str = ""  # for --sandbox: the daemon's launch socket (default: adl-exec's)
    sandbox_user: str = ""  # for --sandbox from a root gateway: the account the server runs as
    deadline_s: float = 2.0
    upstream_urls: Sequence[str] = ()  # servers reached over streamable HTTP


def refusal_text(tool: str, result: Result) -> str:
    reasons = "; ".join(f"{r['rule']}: {r['text']}" for r in result.reasons) or "no reason given"
    return f"adl-enforcer refused {tool} ({result.decision_id or 'no decision id'}): {reasons}"


def server_command(config: GatewayConfig, server: Sequence[str]) -> list[str]:
    """The server's command line, under adl-exec when the server itself is to be sandboxed."""
    if not config.sandbox:
        return list(server)
    launch = config.launch_socket or os.environ.get("ADL_ENFORCER_ADDR", "")
    if not launch:
        raise ValueError("--sandbox needs the daemon's launch socket (--launch-socket or $ADL_ENFORCER_ADDR)")
    if ":" not in launch:
        launch = f"unix:{launch}"
    # The daemon runs a sandboxed server as its caller and never as root: a root gateway launches
    # it as --sandbox-user (setpriv, from util-linux, switches before adl-exec starts).
    switch: list[str] = []
    if config.sandbox_user:
        entry = (
            pwd.getpwuid(int(config.sandbox_user))
            if config.sandbox_user.isdigit()
            else pwd.getpwnam(config.sandbox_user)
        )
        switch = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups"]
    elif os.geteuid() == 0:
        raise ValueError("--sandbox from a root gateway needs --sandbox-user: the daemon never runs a server as root")
    return [
        *switch,
        sys.executable,
        "-m",
        "enforcer.cli.exec",
        "--daemon",
        launch,
        "--agent",
        config.agent,
        "--",
        *server,
    ]


class Gateway:
    """The policy side of the gateway: which tools to show, and whether a call may go through."""

    def __init__(self, config: GatewayConfig, upstreams: Sequence[ClientSession], client: AsyncClient) -> None:
        self.config = config
        self.upstreams = list(upstreams)
        self.client = client
        self.routes: dict[str, ClientSession] = {}  # tool name -> the one server that offers it

    async def declared_tools(self) -> set[str] | None:
        """The tool names the agent's policy declares (None when the daemon cannot say)."""
        summary = await self.client.policy_summary()
        if summary is None:
            log.warning("the daemon could not say which tools %s declares", self.config.agent)
            return None
        return {tool["name"] for tool in summary.get("tools", [])}

    async def upstream_tools(self) -> list[types.Tool]:
        """Every server's tools (all pages), with the routes for the names exactly one server offers."""
        offered: dict[str, list[tuple[types.Tool, ClientSession]]] = {}
        for upstream in self.upstreams:
            cursor = None
            for _ in range(MAX_PAGES):
                listed = await upstream.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                )
                for tool in listed.tools:
                    offered.setdefault(tool.name, []).append((tool, upstream))
                cursor = listed.next_cursor
                if not cursor:
                    break
        ambiguous = sorted(name for name, offers in offered.items() if len(offers) > 1)
        if ambiguous:
            log.warning("tools offered by more than one server are hidden and refused: %s", ", ".join(ambiguous))
        self.routes = {name: offers[0][1] for name, offers in offered.items() if len(offers) == 1}
        return [offers[0][0] for offers in offered.values() if len(offers) == 1]

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        declared = await self.declared_tools()
        if declared is None:  # fail closed: show nothing rather than everything
            return types.ListToolsResult(tools=[])
        return types.ListToolsResult(tools=[tool for tool in await self.upstream_tools() if tool.name in declared])

    async def decide(self, ctx: Any, name: str, arguments: dict[str, Any]) -> Result:
        result = await self.client.check_tool(name, arguments, traceparent=_traceparent(ctx))
        if result.decision != "ASK":
            return result
        if not result.approval_id:
            return result
        deadline = time.monotonic() + self.config.approval_wait_s
        total = math.ceil(self.config.approval_wait_s)
        waited = 0.0
        while result.decision == "ASK":
            left = deadline - time.monotonic()
            if left <= 0:
                return Result.failure(f"no approval within {self.config.approval_wait_s:g} s ({result.approval_id})")
            try:  # progress is a courtesy: the wait goes on without it
                await ctx.session.report_progress(
                    waited, total, f"waiting for approval {result.approval_id} of {name} ({result.decision_id})"
                )
            except Exception as exc:
                log.debug("progress not reported: %s", exc)
            pending = result
            result = await self.client.wait_approval(pending, timeout_s=min(PROGRESS_EVERY_S, left))
            if result.decision == "ASK" and not result.approval_id:
                result = dataclasses.replace(
                    result, approval_id=pending.approval_id, approval_expires_unix_ms=pending.approval_expires_unix_ms
                )
            waited = self.config.approval_wait_s - max(deadline - time.monotonic(), 0)
        return result

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        result = await self.decide(ctx, params.name, arguments)
        if not result.allowed:
            # The SDK's model is populated by field name; mypy sees only its `_meta` alias as a parameter.
            return types.CallToolResult(  # type: ignore[call-arg]
                content=[types.TextContent(type="text", text=refusal_text(params.name, result))],
                is_error=True,
                meta={"adl-enforcer/decision": _decision_meta(result)},
            )
        upstream = self.routes.get(params.name)
        if upstream is None:  # not listed yet (or since): ask the servers again
            await self.upstream_tools()
            upstream = self.routes.get(params.name)
        if upstream is None:
            text = f"adl-enforcer allowed {params.name} ({result.decision_id}) but no single server offers it"
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
        answer = await upstream.call_tool(params.name, arguments)
        if isinstance(answer, types.CallToolResult):
            meta = dict(answer.meta or {})
            meta["adl-enforcer/decision"] = _decision_meta(result)
            return answer.model_copy(update={"meta": meta})
        return answer


def _decision_meta(result: Result) -> dict[str, Any]:
    return {
        "decision": result.decision,
        "decision_id": result.decision_id,
        "rules": [r["rule"] for r in result.reasons],
    }


def _traceparent(ctx: Any) -> str:
    """The client's W3C trace context, when it sent one in the request's _meta."""
    meta = getattr(ctx, "meta", None) or {}
    value = meta.get("traceparent", "") if isinstance(meta, dict) else ""
    return value if isinstance(value, str) else ""


@contextlib.asynccontextmanager
async def open_gateway(config: GatewayConfig) -> AsyncIterator[Server[Any]]:
    """Start the upstream server and connect to it and to the daemon; yield the MCP server to serve."""
    transports: list[Any] = []
    for url in config.upstream_urls:
        from mcp.client.streamable_http import streamable_http_client

        transports.append(streamable_http_client(url))
    for server in config.servers:
        command = server_command(config, server)
        # The server gets the gateway's environment, as any command started from it would; under
        # --sandbox the agent's policy filters it.
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
        transports.append(stdio_client(params))
    client = AsyncClient(config.address or default_address(), agent=config.agent, deadline_s=config.deadline_s)
    try:
        async with contextlib.AsyncExitStack() as stack:
            upstreams = []
            for transport in transports:
                read, write = await stack.enter_async_context(transport)
                upstream = await stack.enter_async_context(ClientSession(read, write))
                await upstream.initialize()
                upstreams.append(upstream)
            gateway = Gateway(config, upstreams, client)
            yield Server("adl-mcp", on_list_tools=gateway.list_tools, on_call_tool=gateway.call_tool)
    finally:
        await client.close()


async def serve_stdio(config: GatewayConfig) -> None:
    async with open_gateway(config) as server, stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(config: GatewayConfig, host: str, port: int) -> None:
    import uvicorn  # comes with the mcp extra

    async with open_gateway(config) as server:
        app = server.streamable_http_app(host=host, transport_security=transport_security(host))
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()


def transport_security(host: str) -> TransportSecuritySettings | None:
    """Host and Origin checks for a loopback address: a web page that rebinds its name to it would
    otherwise act as the agent (the gateway has no authentication of its own). The SDK turns them on
    by itself only for 127.0.0.1, localhost and ::1; every loopback address gets them here. None (no
    check) for the addresses --http-remote allows."""
    if not _loopback(host):
        return None
    names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(f"{name}:*" for name in names),
        allowed_origins=sorted(f"http://{name}:*" for name in names),
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="adl-mcp",
        description="Serve an MCP server's tools to one MCP client, asking adl-enforcerd before every tools/call.",
        epilog="DENY answers a tool error naming the rule; ASK waits for Approve/Reject on the admin socket; "
        "tools the policy does not declare are not listed.",
    )
    parser.add_argument("--agent", required=True, help="the agent (name or id) whose policy decides the calls")
    parser.add_argument("--socket", default="", help="the daemon's API address (default: $ADL_ENFORCER_SOCKET)")
    parser.add_argument(
        "--approval-wait",
        type=float,
        default=DEFAULT_APPROVAL_WAIT_S,
        metavar="S",
        help="how long an ASK may wait for a human before it is refused (default %(default)s)",
    )
    parser.add_argument("--http", default="", metavar="HOST:PORT", help="serve streamable HTTP here instead of stdio")
    parser.add_argument(
        "--http-remote",
        action="store_true",
        help="allow --http on an address other than loopback: whoever connects acts as the agent, "
        "the gateway has no authentication of its own",
    )
    parser.add_argument("--sandbox", action="store_true", help="start the server under adl-exec for the same agent")
    parser.add_argument("--launch-socket", default="", help="with --sandbox: the daemon's launch socket")
    parser.add_argument(
        "--sandbox-user",
        default="",
        metavar="USER",
        help="with --sandbox, when the gateway runs as root: the account (name or uid) the server is "
        "launched as; it must be allowed the agent in the daemon's agent_callers",
    )
    parser.add_argument(
        "--upstream", action="append", default=[], metavar="URL", help="a server reached over streamable HTTP"
    )
    parser.add_argument(
        "--server",
        dest="servers",
        action="append",
        default=[],
        metavar="COMMAND",
        help="another server's command line (split like a shell would; stdio); repeatable",
    )
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- an MCP server's command line (stdio)")
    args = parser.parse_args(argv)
    if args.server and args.server[0] == "--":
        args.server = args.server[1:]
    args.servers = [shlex.split(line) for line in args.servers] + ([args.server] if args.server else [])
    if not args.servers and not args.upstream:
        parser.error("give an MCP server's command line after -- (or --server, --upstream URL)")
    if any(not server for server in args.servers):
        parser.error("--server: an empty command line")
    if args.http:
        host, _, port = args.http.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        if not port.isdigit() or not 0 < int(port) < 65536:
            parser.error(f"--http {args.http!r}: HOST:PORT")
        if not args.http_remote and not _loopback(host):
            parser.error(f"--http {host} is not loopback: anyone who reaches it acts as the agent (--http-remote)")
        args.http_host, args.http_port = host, int(port)
    if args.sandbox and not args.servers:
        parser.error("--sandbox applies to the servers the gateway starts, and there are none (--upstream only)")
    if args.sandbox and not (args.launch_socket or os.environ.get("ADL_ENFORCER_ADDR")):
        parser.error("--sandbox needs the daemon's launch socket (--launch-socket or $ADL_ENFORCER_ADDR)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("ADL_MCP_LOG", "WARNING"), stream=sys.stderr, format="adl-mcp: %(message)s"
    )
    address = args.socket if not args.socket or ":" in args.socket else f"unix:{args.socket}"
    config = GatewayConfig(
        agent=args.agent,
        servers=args.servers,
        address=address,
        approval_wait_s=args.approval_wait,
        sandbox=args.sandbox,
        launch_socket=args.launch_socket,
        sandbox_user=args.sandbox_user,
        upstream_urls=args.upstream,
    )
    if args.http:
        anyio.run(serve_http, config, args.http_host, args.http_port)
    else:
        anyio.run(serve_stdio, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
