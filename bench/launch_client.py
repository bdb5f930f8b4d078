"""The daemon launch client alone: `adl-exec --daemon` against a tiny launch socket that answers as
adl-enforcerd does (LaunchReply accepted, then SessionEnded with exit code 0, at once), interleaved
with `python -c pass`, so what is timed is the client: interpreter start-up, its imports, reading
the command line, the request, the socket and the two replies.

Run: .venv/bin/python bench/launch_client.py [ROUNDS [OTHER_TREE]]
     .venv/bin/python bench/launch_client.py memory [OTHER_TREE]

Each round runs, in a rotated order: `python -c pass`, `python -m enforcer.cli.exec --daemon ...`,
the installed `adl-exec --daemon ...` script, the same with --report (the socket sends a kernel
denials' summary, as a supervisor does), and with OTHER_TREE (an unpacked tree of the project, its
bytecode compiled) its client by `python -m` with PYTHONPATH, without and with --report. Reported:
medians and the median and range of per-round ratios and differences to `python -c pass`, of wall
time and of the process's CPU time (user + system, from wait4: less sensitive than wall time to
other work on the machine).

`memory`: the client waits for the session's end for the session's whole life; its USS, PSS and RSS
(/proc/PID/smaps_rollup) while it waits, against `python -c 'import time; time.sleep(...)'`, three
rounds, with OTHER_TREE's client too.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from enforcer.framing import recv_frame, send_frame
from enforcer.v1 import enforcer_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
# The kernel denials' summary of a session that had none, as a supervisor sends it (--report prints it).
DENIALS = json.dumps({"available": True, "denials": 0, "recorded": 0, "top": [], "lost_in_kernel_queue": 0})


def serve(listener: socket.socket, stop: threading.Event, session_s: float = 0.0) -> None:
    """Answer each connection as the daemon does for an accepted launch of a command that exits 0
    (after session_s)."""
    listener.settimeout(0.2)
    n = 0
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            frame = recv_frame(conn, max_fds=3)
            if frame is None:
                continue
            for fd in frame[1]:
                os.close(fd)
            request = pb.LaunchRequest.FromString(frame[0])
            if list(request.argv) != ["/bin/true"] or request.agent != "A":
                raise SystemExit(f"unexpected request {request}")
            n += 1
            session = f"s-{n}"
            send_frame(conn, pb.LaunchReply(accepted=True, session=session, session_token="t").SerializeToString())
            time.sleep(session_s)
            ended = pb.SessionEnded(session=session, reason="exit", exit_code=0, kernel_denials_json=DENIALS)
            send_frame(conn, ended.SerializeToString())


def run(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run, which must exit 0."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stderr=subprocess.DEVNULL)  # --report's lines
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit code {proc.returncode}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def memory_mib(pid: int) -> tuple[float, float, float]:
    """(USS, PSS, RSS) of a process, MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0]) / 1024
    return fields["Private_Clean"] + fields["Private_Dirty"], fields["Pss"], fields["Rss"]


@contextlib.contextmanager
def launch_socket(session_s: float = 0.0) -> Iterator[tuple[str, str]]:
    """(a temporary directory, the path of a launch socket in it that serve() answers)."""
    with tempfile.TemporaryDirectory(prefix=f"adl-client-bench-{os.getpid()}-") as tmp:
        path = f"{tmp}/launch.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(16)
        stop = threading.Event()
        server = threading.Thread(target=serve, args=(listener, stop, session_s), daemon=True)
        server.start()
        try:
            yield tmp, path
        finally:
            stop.set()
            server.join()
            listener.close()


def memory(other_tree: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with launch_socket(1.5) as (tmp, path):
        client = [sys.executable, "-m", "enforcer.cli.exec", "--daemon", f"unix:{path}", "--agent", "A", "--"]
        commands = {
            "python, sleeping": ([sys.executable, "-c", "import time; time.sleep(1.5)"], env),
            "adl-exec --daemon, waiting": ([*client, "/bin/true"], env),
        }
        if other_tree:
            commands["other tree's client, waiting"] = ([*client, "/bin/true"], {**env, "PYTHONPATH": other_tree})
        print("while the session runs, 0.8 s in (MiB):        USS    PSS    RSS")
        for _ in range(3):
            for name, (argv, environ) in commands.items():
                proc = subprocess.Popen(argv, env=environ, cwd=tmp)
                time.sleep(0.8)
                uss, pss, rss = memory_mib(proc.pid)
                if proc.wait() != 0:
                    raise SystemExit(f"{argv}: exit code {proc.returncode}")
                print(f"  {name:<40} {uss:6.1f} {pss:6.1f} {rss:6.1f}")


def main() -> None:
    if sys.argv[1:2] == ["memory"]:
        memory(sys.argv[2] if len(sys.argv) > 2 else None)
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    other_tree = sys.argv[2] if len(sys.argv) > 2 else None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with launch_socket() as (tmp, path):
        launch = ["--daemon", f"unix:{path}", "--agent", "A", "--", "/bin/true"]
        script = str(Path(sys.executable).parent / "adl-exec")
        commands = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "python -m enforcer.cli.exec": ([sys.executable, "-m", "enforcer.cli.exec", *launch], env),
            "adl-exec (script)": ([script, *launch], env),
            "adl-exec --report (script)": ([script, "--report", *launch], env),
        }
        if other_tree:
            other_env = {**env, "PYTHONPATH": other_tree}
            commands["other tree, -m"] = ([sys.executable, "-m", "enforcer.cli.exec", *launch], other_env)
            commands["other tree, -m --report"] = (
                [sys.executable, "-m", "enforcer.cli.exec", "--report", *launch],
                other_env,
            )
        for argv, environ in commands.values():  # warm the page cache and the bytecode
            run(argv, environ, tmp)
        names = list(commands)
        samples: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, used = run(*commands[name], cwd=tmp)
                samples[name].append(wall)
                cpu[name].append(used)
    for title, figures in (("wall time", samples), ("CPU time", cpu)):
        base = figures["python -c pass"]
        print(f"{title}, {rounds} interleaved rounds: median ms; per round vs python -c pass: ratio, difference (ms)")
        for name in names:
            ratios = [a / b for a, b in zip(figures[name], base, strict=True)]
            diffs = [a - b for a, b in zip(figures[name], base, strict=True)]
            print(
                f"  {name:<30} {statistics.median(figures[name]):7.1f}   {statistics.median(ratios):5.2f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f})   {statistics.median(diffs):+5.1f} ms "
                f"({min(diffs):+.1f} to {max(diffs):+.1f})"
            )


if __name__ == "__main__":
    main()
