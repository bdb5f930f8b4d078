"""Check over the unix socket against a bare gRPC echo on the same server stack, in one run.

The daemon serves Check on its inline loop (enforcer/daemon/inline.py) beside a grpcio server; the
echo server is built the same way (a grpcio server whose echo method the inline loop serves), and
"sync-echo", grpcio's sync server with the daemon's thread pool size alone, is printed for scale.
Every server listens on a unix socket in its own process placed like the daemon's API process
(api_cpus "one": all its threads on one CPU); the daemon decides and appends an audit record
(group commit) before answering. Each caller has its own channel and makes one call at a time;
callers run as asyncio tasks, at most 8 to a client process, so that the clients' own CPU use
leaves room for the servers. Prints p50/p99 latency and calls/s at 1 and 16 callers, and the ratio
Check / echo.

Targets: Check p50 within 1.3x of the echo round trip; at least 5,000 checks/s with 16 callers.

Run (as root): .venv/bin/python bench/check.py [SECONDS_PER_CASE]
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ECHO_METHOD = "/bench.Echo/Echo"


CALLERS_PER_PROCESS = 8


def echo_server(path: str, ready: multiprocessing.synchronize.Event, workers: int, inline: bool) -> None:  # type: ignore[name-defined]
    import grpc

    from enforcer.daemon import affinity
    from enforcer.daemon.inline import InlineUnary

    def echo(request: bytes, context: object) -> bytes:
        return request

    affinity.pin_this_process("one")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    if inline:
        loop = InlineUnary(server, {ECHO_METHOD: lambda messages: [(grpc.StatusCode.OK, "", m) for m in messages]})
    else:
        handler = grpc.method_handlers_generic_handler(
            "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo, lambda b: b, lambda b: b)}
        )
        server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()
    if inline:
        loop.start()
    ready.set()
    server.wait_for_termination()


def client_process(
    kind: str,
    path: str,
    payload: bytes,
    callers: int,
    seconds: float,
    start_at: float,
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    import asyncio

    import grpc

    method = "/enforcer.v1.Enforcer/Check" if kind == "check" else ECHO_METHOD

    async def caller(latencies: list[float], errors: list[int]) -> None:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            call = channel.unary_unary(method)
            for _ in range(50):  # warm the connection
                await call(payload, timeout=5)
            await asyncio.sleep(max(start_at - time.time(), 0))
            end = time.perf_counter() + seconds
            while (now := time.perf_counter()) < end:
                try:
                    await call(payload, timeout=5)
                except grpc.RpcError:
                    errors.append(1)
                latencies.append(time.perf_counter() - now)

    async def run() -> tuple[list[float], int]:
        latencies: list[float] = []
        errors: list[int] = []
        await asyncio.gather(*(caller(latencies, errors) for _ in range(callers)))
        return latencies, len(errors)

    out.put(asyncio.run(run()))


def measure(kind: str, path: str, payload: bytes, callers: int, seconds: float) -> dict[str, float]:
    # Fresh interpreters: this process has used gRPC (the health check), and gRPC state inherited
    # through fork can deadlock a child's first channel.
    spawn = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = spawn.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 4.0
    shares = [CALLERS_PER_PROCESS] * (callers // CALLERS_PER_PROCESS)
    if callers % CALLERS_PER_PROCESS:
        shares.append(callers % CALLERS_PER_PROCESS)
    procs = [
        spawn.Process(target=client_process, args=(kind, path, payload, n, seconds, start_at, out)) for n in shares
    ]
    for p in procs:
        p.start()
    latencies: list[float] = []
    errors = 0
    for _ in procs:
        got, err = out.get(timeout=seconds + 60)
        latencies += got
        errors += err
    for p in procs:
        p.join()
    latencies.sort()
    return {
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "per_s": len(latencies) / seconds,
        "errors": errors,
    }


def start_daemon(tmp: Path) -> subprocess.Popen[bytes]:
    policies = tmp / "policies"
    policies.mkdir()
    shutil.copy(REPO / "policies" / "examples" / "coding-agent.adl.json", policies)
    env = {
        **os.environ,
        "ADL_ENFORCER_POLICY_DIR": str(policies),
        "ADL_ENFORCER_SOCKET": str(tmp / "api.sock"),
        "ADL_ENFORCER_ADMIN_SOCKET": str(tmp / "admin.sock"),
        "ADL_ENFORCER_LAUNCH_SOCKET": str(tmp / "launch.sock"),
        "ADL_ENFORCER_AUDIT_DIR": str(tmp / "audit"),
        "ADL_ENFORCER_AUDIT_KEY": str(tmp / "key.pem"),
        "ADL_ENFORCER_CGROUP_GROUP": "adl-bench",
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "enforcer.cli.enforcerd", "--log-level", "WARNING"], env=env, stdin=subprocess.DEVNULL
    )
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (tmp / "api.sock").exists():
            with grpc.insecure_channel(f"unix:{tmp / 'api.sock'}") as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return daemon
                except grpc.RpcError:
                    pass
        time.sleep(0.1)
    daemon.kill()
    raise SystemExit("adl-enforcerd did not start")


def main() -> None:
    from enforcer.v1 import enforcer_pb2 as pb

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    request = pb.CheckRequest(
        agent="Coding Agent", tool=pb.ToolCall(name="read_file", arguments_json='{"path": "src/app.py"}')
    ).SerializeToString()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        echoes = []
        for label, inline in (("echo", True), ("sync-echo", False)):
            ready = multiprocessing.Event()
            args = (str(tmp / f"{label}.sock"), ready, 16, inline)
            echoes.append(multiprocessing.Process(target=echo_server, args=args, daemon=True))
            echoes[-1].start()
            ready.wait(30)
        daemon = start_daemon(tmp)
        try:
            print(f"{seconds:.0f} s per case; Check is read_file on the coding agent example (ALLOW, audited)")
            print("echo: the daemon's stack (inline loop); sync-echo: grpcio's sync server alone, for scale")
            print(f"{'callers':>7} {'service':>9} {'p50 µs':>8} {'p99 µs':>8} {'calls/s':>9} {'errors':>6}")
            for callers in (1, 16):
                results = {}
                for kind in ("echo", "check", "sync-echo"):
                    path = tmp / ("api.sock" if kind == "check" else f"{kind}.sock")
                    results[kind] = r = measure(kind, str(path), request, callers, seconds)
                    print(
                        f"{callers:>7} {kind:>9} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['per_s']:>9.0f} "
                        f"{r['errors']:>6.0f}"
                    )
                ratio = results["check"]["p50_us"] / results["echo"]["p50_us"]
                share = results["check"]["per_s"] / results["echo"]["per_s"]
                print(f"{callers:>7}  check/echo: p50 x{ratio:.2f}, throughput {share:.0%} of echo")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(20)
            for echo in echoes:
                echo.terminate()


if __name__ == "__main__":
    main()
