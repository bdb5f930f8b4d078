"""adl-mcp's added latency per tools/call against calling the same MCP server directly, in one run.

A daemon (its own temporary sockets, policy and audit log) holds one agent declaring an `echo` tool
with a schema. Two MCP client sessions (the `mcp` SDK over stdio) are opened: one straight to an
echo server, one to adl-mcp in front of a second copy of it. Calls alternate between the two in
ROUNDS rounds of CALLS each (one call at a time), so both see the same machine state. Prints p50,
p90 and p99 per path and the p50 difference: the Check, its audit record, and the extra stdio hop.

Run (as root): .venv/bin/python bench/mcp_gateway.py [--rounds N] [--calls N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SERVER = textwrap.dedent(
    """
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("echo")

    @server.tool()
    def echo(text: str) -> str:
        return text

    server.run()
    """
)

ADL = {
    "adl_spec": "0.3.0",
    "name": "Bench Gateway",
    "description": "gateway latency bench",
    "version": "1.0.0",
    "data_classification": {"sensitivity": "internal"},
    "tools": [
        {
            "name": "echo",
            "description": "echo",
            "read_only": True,
            "parameters": {
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string"}},
                "additionalProperties": False,
            },
        }
    ],
}


def start_daemon(root: Path) -> tuple[subprocess.Popen[bytes], Path]:
    policies = root / "policies"
    policies.mkdir()
    (policies / "bench.adl.json").write_text(json.dumps(ADL))
    api = root / "api.sock"
    env = {
        **os.environ,
        "ADL_ENFORCER_POLICY_DIR": str(policies),
        "ADL_ENFORCER_SOCKET": str(api),
        "ADL_ENFORCER_ADMIN_SOCKET": str(root / "admin.sock"),
        "ADL_ENFORCER_LAUNCH_SOCKET": str(root / "launch.sock"),
        "ADL_ENFORCER_AUDIT_DIR": str(root / "audit"),
        "ADL_ENFORCER_AUDIT_KEY": str(root / "audit-key.pem"),
        "ADL_ENFORCER_CGROUP_GROUP": f"adl-bench-{os.getpid()}",
    }
    log = open(root / "daemon.log", "ab")  # noqa: SIM115 (the daemon keeps it)
    proc = subprocess.Popen([sys.executable, "-m", "enforcer.cli.enforcerd"], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while not api.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start:\n{(root / 'daemon.log').read_text()}")
        time.sleep(0.05)
    time.sleep(0.5)  # health SERVING follows the socket closely
    return proc, api


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(server: Path, api: Path, rounds: int, calls: int) -> dict[str, list[float]]:
    direct = StdioServerParameters(command=sys.executable, args=[str(server)])
    gateway = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "enforcer.integrations.mcp_gateway",
            "--agent",
            "Bench Gateway",
            "--socket",
            f"unix:{api}",
            "--",
            sys.executable,
            str(server),
        ],
        env=dict(os.environ),
    )
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    async with (
        stdio_client(direct) as (dr, dw),
        ClientSession(dr, dw) as to_server,
        stdio_client(gateway) as (gr, gw),
        ClientSession(gr, gw) as to_gateway,
    ):
        await to_server.initialize()
        await to_gateway.initialize()
        for session in (to_server, to_gateway):  # warm both paths
            for _ in range(20):
                await session.call_tool("echo", {"text": "warm"})
        for round_no in range(rounds):
            order = [("direct", to_server), ("gateway", to_gateway)]
            if round_no % 2:
                order.reverse()
            for label, session in order:
                for _ in range(calls):
                    started = time.perf_counter()
                    result = await session.call_tool("echo", {"text": "hello"})
                    times[label].append(time.perf_counter() - started)
                    if result.is_error:
                        raise SystemExit(f"{label}: {result}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="adl-bench-mcp-") as tmp:
        root = Path(tmp)
        server = root / "echo_server.py"
        server.write_text(SERVER)
        daemon, api = start_daemon(root)
        try:
            times = anyio.run(measure, server, api, args.rounds, args.calls)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=15)
    for label, values in times.items():
        ms = [v * 1000 for v in values]
        print(
            f"{label:8} n={len(ms)} p50={statistics.median(ms):.3f} ms p90={percentile(ms, 0.9):.3f} ms "
            f"p99={percentile(ms, 0.99):.3f} ms"
        )
    added = statistics.median(times["gateway"]) - statistics.median(times["direct"])
    print(f"added by adl-mcp (p50): {added * 1000:.3f} ms per tools/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
