"""Check over the unix socket against a bare gRPC echo on the same server stack, in one run.

The daemon serves Check on its inline loop (enforcer/daemon/inline.py) beside a grpcio server; the
echo server is built the same way (a grpcio server whose echo method the inline loop serves), and
"sync-echo", grpcio's sync server with the daemon's thread pool size alone, is printed for scale.
Every server listens on a unix socket in its own process placed like the daemon's API process
(api_cpus "one": all its threads on one CPU); the daemon decides and appends an audit record
(group commit) before answering. Each caller has its own channel to each service and makes one call
at a time, with a 5 s deadline. Two kinds of callers are measured, one after the other:

- py: Python runtimes' callers, grpc.aio, as asyncio tasks, at most 8 to a client process (so that
  the clients' own CPU use leaves room for the servers). They spend about as much CPU per call as
  the daemon, on the same two CPUs, so their figures at 16 callers are a limit of the machine as
  much as of the server.
- c++: threads of bench/loadgen.cc (grpc++'s generic stub, built here with g++ and pkg-config from
  Debian's libgrpc++-dev), which spend about half as much per call. Their figures are nearer what the
  server itself can serve; their round trip is shorter, so the same server cost is a larger ratio.

These machines are shared: their speed moves by a third within seconds, so services measured one
after the other in long runs compare the machine's states as much as the services. Here the
services take turns in short windows (ROUNDS rounds; in each, one window per service, echo and
Check next to each other, their order swapped every round), and every caller switches service at
the same instant. Each round gives a Check/echo pair measured on the same machine state. Prints,
per caller count, p50/p99 latency and calls/s over all windows, and the median (and range) of the
rounds' Check/echo p50 ratios and of Check's calls/s per window.

Targets: Check p50 within 1.3x of the echo round trip; at least 5,000 checks/s with 16 callers.

Run (as root): .venv/bin/python bench/check.py [--rounds N] [--window SECONDS] [--callers both|python|cpp]
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ECHO_METHOD = "/bench.Echo/Echo"
CHECK_METHOD = "/enforcer.v1.Enforcer/Check"
CALLERS_PER_PROCESS = 8


def echo_server(path: str, ready: multiprocessing.synchronize.Event, workers: int, inline: bool) -> None:  # type: ignore[name-defined]
    import grpc

    from enforcer.daemon import affinity
    from enforcer.daemon.config import Settings
    from enforcer.daemon.inline import InlineUnary

    def echo(request: bytes, context: object) -> bytes:
        return request

    affinity.pin_this_process("one")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    if inline:
        echo_all = {ECHO_METHOD: lambda messages: [(grpc.StatusCode.OK, "", m) for m in messages]}
        loop = InlineUnary(server, echo_all, nice=Settings.model_fields["inline_nice"].default)  # as the daemon's
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


# One window: (service, start, end) in time.time() seconds.
Window = tuple[str, float, float]


def client_process(
    targets: dict[str, tuple[str, str]],
    payload: bytes,
    callers: int,
    windows: list[Window],
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    import asyncio

    import grpc

    # Windows are set in wall-clock time (shared by all client processes) and timed with perf_counter.
    to_perf = time.perf_counter() - time.time()

    async def caller(latencies: list[list[float]], errors: list[int]) -> None:
        channels = {kind: grpc.aio.insecure_channel(f"unix:{path}") for kind, (path, _) in targets.items()}
        try:
            calls = {kind: channels[kind].unary_unary(method) for kind, (_, method) in targets.items()}
            for call in calls.values():
                for _ in range(50):  # warm the connection
                    await call(payload, timeout=5)
            for index, (kind, start, end) in enumerate(windows):
                call, got = calls[kind], latencies[index]
                await asyncio.sleep(max(start - time.time(), 0))
                end_perf = end + to_perf
                while (now := time.perf_counter()) < end_perf:
                    try:
                        await call(payload, timeout=5)
                    except grpc.RpcError:
                        errors[index] += 1
                    got.append(time.perf_counter() - now)
        finally:
            for channel in channels.values():
                await channel.close()

    async def run() -> tuple[list[list[float]], list[int]]:
        latencies: list[list[float]] = [[] for _ in windows]
        errors = [0] * len(windows)
        await asyncio.gather(*(caller(latencies, errors) for _ in range(callers)))
        return latencies, errors

    out.put(asyncio.run(run()))


def schedule(kinds: list[str], rounds: int, window_s: float, gap_s: float, start: float) -> list[Window]:
    """Every round runs each service once; echo and Check (the first two kinds) are next to each
    other and swap places every round, so neither always follows the other."""
    windows: list[Window] = []
    at = start
    for round_ in range(rounds):
        pair = kinds[:2] if round_ % 2 == 0 else kinds[1::-1]
        for kind in pair + kinds[2:]:
            windows.append((kind, at, at + window_s))
            at += window_s + gap_s
    return windows


def measure(
    targets: dict[str, tuple[str, str]],
    payload: bytes,
    callers: int,
    rounds: int,
    window_s: float,
    loadgen: Path | None = None,
) -> tuple[list[Window], list[list[float]], list[int]]:
    """Latencies and errors per window, all callers together. `targets`: service -> (socket path,
    method); the first two are the pair every round puts next to each other. Callers are Python
    (grpc.aio) client processes, or with `loadgen` threads of that C++ program."""
    # Time for every client process to start and warm its channels before the first window.
    windows = schedule(list(targets), rounds, window_s, gap_s=0.2, start=time.time() + 6.0)
    if loadgen is not None:
        return windows, *run_loadgen(loadgen, targets, payload, callers, windows)
    # Fresh interpreters: this process has used gRPC (the health check), and gRPC state inherited
    # through fork can deadlock a child's first channel.
    spawn = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = spawn.Queue()  # type: ignore[type-arg]
    shares = [CALLERS_PER_PROCESS] * (callers // CALLERS_PER_PROCESS)
    if callers % CALLERS_PER_PROCESS:
        shares.append(callers % CALLERS_PER_PROCESS)
    procs = [spawn.Process(target=client_process, args=(targets, payload, n, windows, out)) for n in shares]
    for p in procs:
        p.start()
    latencies: list[list[float]] = [[] for _ in windows]
    errors = [0] * len(windows)
    deadline = windows[-1][2] + 60
    for _ in procs:
        got, err = _next_result(out, procs, deadline)
        for index in range(len(windows)):
            latencies[index] += got[index]
            errors[index] += err[index]
    for p in procs:
        p.join()
    return windows, latencies, errors


def _next_result(
    out: multiprocessing.Queue,  # type: ignore[type-arg]
    procs: list[multiprocessing.process.BaseProcess],
    deadline: float,
) -> Any:
    """The next client's results; stops the run if a client died without any (its traceback is above)."""
    while time.time() < deadline:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit("a client process failed; see its error above") from None
    raise SystemExit("the client processes did not report in time")


def build_loadgen(directory: Path) -> Path:
    """bench/loadgen.cc compiled into `directory` (needs g++, pkg-config and libgrpc++-dev)."""
    binary = directory / "loadgen"
    try:
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True, check=True
        ).stdout.split()
        subprocess.run(
            ["g++", "-O2", "-std=c++17", "-o", str(binary), str(REPO / "bench" / "loadgen.cc"), *flags],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise SystemExit(
            f"cannot build the C++ callers ({detail.strip()[:300]}); install them with "
            "`apt-get install -y g++ pkg-config libgrpc++-dev`, or run with --callers python"
        ) from None
    return binary


def run_loadgen(
    binary: Path, targets: dict[str, tuple[str, str]], payload: bytes, callers: int, windows: list[Window]
) -> tuple[list[list[float]], list[int]]:
    """Latencies (seconds) and errors per window from one loadgen process running `callers` threads."""
    job = [f"callers {callers}", f"payload {payload.hex()}"]
    job += [f"target {kind} {path} {method}" for kind, (path, method) in targets.items()]
    job += [f"window {kind} {start!r} {end!r}" for kind, start, end in windows]
    done = subprocess.run(
        [str(binary)],
        input="\n".join(job) + "\n",
        capture_output=True,
        text=True,
        timeout=windows[-1][2] - time.time() + 60,
    )
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != len(windows):
        raise SystemExit(f"loadgen failed (exit {done.returncode}): {done.stderr.strip()[:500]}")
    latencies, errors = [], []
    for line, (kind, _, _) in zip(lines, windows, strict=True):
        got_kind, failed, *nanoseconds = line.split()
        if got_kind != kind:
            raise SystemExit(f"loadgen reported {got_kind!r} for a {kind!r} window")
        latencies.append([int(ns) / 1e9 for ns in nanoseconds])
        errors.append(int(failed))
    return latencies, errors


def p50_us(latencies: list[float]) -> float:
    return statistics.median(latencies) * 1e6


def p99_us(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[int(len(ordered) * 0.99)] * 1e6


def spread(values: list[float], form: str) -> str:
    return f"median {form.format(statistics.median(values))} ({form.format(min(values))}-{form.format(max(values))})"


def report(label: str, windows: list[Window], latencies: list[list[float]], errors: list[int], window_s: float) -> None:
    kinds = list(dict.fromkeys(kind for kind, _, _ in windows))
    for kind in kinds:
        mine = [i for i, (k, _, _) in enumerate(windows) if k == kind]
        pooled = [x for i in mine for x in latencies[i]]
        per_s = len(pooled) / (window_s * len(mine))
        failed = sum(errors[i] for i in mine)
        print(f"{label:>7} {kind:>9} {p50_us(pooled):>8.0f} {p99_us(pooled):>8.0f} {per_s:>9.0f} {failed:>6}")
    # The first two services (echo and Check) have one window each in every round, next to each other.
    base, measured = ([latencies[i] for i, (k, _, _) in enumerate(windows) if k == kind] for kind in kinds[:2])
    ratios = [p50_us(m) / p50_us(b) for b, m in zip(base, measured, strict=True)]
    shares = [len(m) / len(b) for b, m in zip(base, measured, strict=True)]
    rates = [len(m) / window_s for m in measured]
    print(f"{label:>7}  {kinds[1]}/{kinds[0]} p50 by round: {spread(ratios, 'x{:.2f}')}")
    print(
        f"{label:>7}  {kinds[1]} calls/s by window: {spread(rates, '{:,.0f}')}; "
        f"{spread(shares, '{:.0%}')} of {kinds[0]}'s"
    )


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
    import argparse

    from enforcer.v1 import enforcer_pb2 as pb

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8, help="windows per service and caller count (default 8)")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per window (default 2)")
    parser.add_argument(
        "--callers",
        choices=("both", "python", "cpp"),
        default="both",
        help="Python (grpc.aio) callers, C++ callers (bench/loadgen.cc, built here), or both (default)",
    )
    args = parser.parse_args()
    request = pb.CheckRequest(
        agent="Coding Agent", tool=pb.ToolCall(name="read_file", arguments_json='{"path": "src/app.py"}')
    ).SerializeToString()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        implementations: list[tuple[str, Path | None]] = []
        if args.callers in ("both", "python"):
            implementations.append(("py", None))
        if args.callers in ("both", "cpp"):
            implementations.append(("c++", build_loadgen(tmp)))
        echoes = []
        for label, inline in (("echo", True), ("sync-echo", False)):
            ready = multiprocessing.Event()
            server_args = (str(tmp / f"{label}.sock"), ready, 16, inline)
            echoes.append(multiprocessing.Process(target=echo_server, args=server_args, daemon=True))
            echoes[-1].start()
            ready.wait(30)
        daemon = start_daemon(tmp)
        targets = {
            "echo": (str(tmp / "echo.sock"), ECHO_METHOD),
            "check": (str(tmp / "api.sock"), CHECK_METHOD),
            "sync-echo": (str(tmp / "sync-echo.sock"), ECHO_METHOD),
        }
        try:
            print(
                f"{args.rounds} rounds of {args.window:g} s windows per service, in turns; "
                "Check is read_file on the coding agent example (ALLOW, audited)"
            )
            print("echo: the daemon's stack (inline loop); sync-echo: grpcio's sync server alone, for scale")
            print(f"{'callers':>7} {'service':>9} {'p50 µs':>8} {'p99 µs':>8} {'calls/s':>9} {'errors':>6}")
            for impl, loadgen in implementations:
                for callers in (1, 16):
                    measured = measure(targets, request, callers, args.rounds, args.window, loadgen)
                    report(f"{callers} {impl}", *measured, args.window)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(20)
            for echo in echoes:
                echo.terminate()


if __name__ == "__main__":
    main()
