"""The egress filter against a direct connection, in one run, against the same test server.

Builds the tests' network lab (two namespaces and a veth; nothing on the machine's own namespace),
then runs bench/egress_client.py twice: directly in the outer namespace (by address), and inside an
adl-exec sandbox whose policy allows the server's name (DNS stub, capture, checks, relay). Prints
connection setup latency (connect until the first response byte) p50/p99, bulk throughput, and
the ratios.

Targets: added setup latency p50 under 1 ms; throughput at least half of direct.

With OTHER_TREE (a checkout of another revision, e.g. an unpacked `git archive` with its generated
enforcer/v1), each round also runs the filter from that tree (PYTHONPATH), and the bench prints the
per-round ratios of this tree's filter to it: added setup p50, connections per second, and the CPU
time the sandboxed run took beyond the client's own per connection it opened (the filter's work,
with the launch's fixed cost spread over the run's connections: CPU time, unlike the rates, hardly
moves with the machine's load).

Run (as root): .venv/bin/python bench/egress.py [CONNECTIONS] [BULK_MIB] [ROUNDS] [OTHER_TREE]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.netlab import NetLab  # noqa: E402
from tests.helpers.sandbox import Sandbox, agent_tmp_dir  # noqa: E402

CLIENT = REPO / "bench" / "egress_client.py"
PORT = 9000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def sandboxed(box: Sandbox, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of the client under adl-exec; adds `other_cpu_us`: the CPU time of everything but the
    client (launcher, egress filter) per connection the client opened."""
    before = children_cpu_s()
    result = box.run("python3", *[a.format(host="api.example.test") for a in args], timeout=300, env=env)
    if result.code != 0:
        raise SystemExit(f"filtered client failed: {result.err}")
    run: dict[str, Any] = json.loads(result.out)
    run["other_cpu_us"] = (children_cpu_s() - before - run["cpu_s"]) / run["connections"] * 1e6
    return run


def main() -> None:
    connections = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    bulk = (int(sys.argv[2]) if len(sys.argv) > 2 else 512) << 20
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    other_tree = os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else None
    if os.geteuid() != 0:
        raise SystemExit("bench/egress.py needs root (network namespaces)")
    direct: list[dict[str, Any]] = []
    filtered: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    with agent_tmp_dir() as tmp:  # the agent's uid must reach the workspace in it
        root = Path(tmp)
        (root / "lab").mkdir()
        lab = NetLab(root / "lab")
        try:
            lab.start()
            # Each round opens thousands of connections from the lab's outer namespace (the direct
            # client's and the filter's upstream ones) to one server port: without reuse, their
            # TIME_WAIT sockets fill the ephemeral port range within a few rounds and every later
            # connect(2) searches it, for direct and filtered runs alike. Only the lab's namespace.
            for setting in ("net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65000"):
                if lab.in_outer("sysctl", "-qw", setting).returncode != 0:
                    raise SystemExit(f"cannot set {setting} in the lab's outer namespace")
            box = Sandbox(root / "box")
            box.wrap, box.env = lab.wrap(), lab.env()
            box.permissions["filesystem"]["allowed_paths"].append({"path": f"{REPO}/bench/**", "access": "read"})
            box.permissions["resource_limits"] = {"max_duration_sec": 300}
            box.permissions["network"] = {"allowed_hosts": ["api.example.test"], "allowed_ports": [PORT]}
            args = [str(CLIENT), "{host}", str(PORT), str(connections), str(bulk)]
            # `python -m` looks in the working directory first: neither tree's, so each run's
            # PYTHONPATH (or this tree's installation) decides which filter runs.
            os.chdir(root)
            for _ in range(rounds):  # interleaved, so a noisy neighbour hits both sides alike
                run = lab.in_outer(sys.executable, *[a.format(host="198.51.100.10") for a in args], timeout=300)
                if run.returncode != 0:
                    raise SystemExit(f"direct client failed: {run.stderr}")
                direct.append(json.loads(run.stdout))
                filtered.append(sandboxed(box, args))
                if other_tree is not None:
                    other.append(sandboxed(box, args, {"PYTHONPATH": other_tree}))
        finally:
            lab.stop()
    d_setup = [us for run in direct for us in run["setup_us"]]
    f_setup = [us for run in filtered for us in run["setup_us"]]
    print(
        f"egress filter vs direct: {rounds} interleaved rounds of {connections} new connections, {bulk >> 20} MiB bulk"
    )
    print(f"{'':28}{'direct':>12}{'filter':>12}{'added':>12}{'ratio':>9}")
    for label, q in (("setup p50 (us)", 0.5), ("setup p99 (us)", 0.99)):
        d, f = percentile(d_setup, q), percentile(f_setup, q)
        print(f"{label:28}{d:12.0f}{f:12.0f}{f - d:12.0f}{f / d:8.2f}x")
    d_rates = [run["bytes"] / run["seconds"] / 1e6 for run in direct]
    f_rates = [run["bytes"] / run["seconds"] / 1e6 for run in filtered]
    ratio = statistics.median(f / d for f, d in zip(f_rates, d_rates, strict=True))
    d_rate, f_rate = statistics.median(d_rates), statistics.median(f_rates)
    print(f"{'throughput median (MB/s)':28}{d_rate:12.0f}{f_rate:12.0f}{'':12}{ratio:8.2f}x")
    print(f"per-round throughput ratios: {', '.join(f'{f / d:.2f}' for f, d in zip(f_rates, d_rates, strict=True))}")
    d_conn = [run["rate"] for run in direct]
    f_conn = [run["rate"] for run in filtered]
    conn_ratios = [f / d for f, d in zip(f_conn, d_conn, strict=True)]
    print(
        f"{'new connections/s, 16 conc.':28}{statistics.median(d_conn):12.0f}{statistics.median(f_conn):12.0f}"
        f"{'':12}{statistics.median(conn_ratios):8.2f}x"
    )
    print(f"per-round connection-rate ratios: {', '.join(f'{r:.2f}' for r in conn_ratios)}")
    print(
        f"per-round connections/s: direct {', '.join(f'{r:.0f}' for r in d_conn)};"
        f" filter {', '.join(f'{r:.0f}' for r in f_conn)}"
    )
    d_round = [percentile(run["setup_us"], 0.5) for run in direct]
    f_round = [percentile(run["setup_us"], 0.5) for run in filtered]
    added_rounds = sorted(f - d for f, d in zip(f_round, d_round, strict=True))
    print(f"per-round added setup p50 (us): {', '.join(f'{a:.0f}' for a in added_rounds)}")
    f_cpu = [run["other_cpu_us"] for run in filtered]
    print(f"launcher and filter CPU per connection (us), per round: {', '.join(f'{c:.0f}' for c in f_cpu)}")
    if other:
        o_round = [percentile(run["setup_us"], 0.5) for run in other]
        added_ratios = [(f - d) / (o - d) for f, o, d in zip(f_round, o_round, d_round, strict=True)]
        o_conn = [run["rate"] for run in other]
        rate_ratios = [f / o for f, o in zip(f_conn, o_conn, strict=True)]
        print(f"this tree vs {other_tree}, per round:")
        print(
            f"  added setup p50 (us): this {', '.join(f'{f - d:.0f}' for f, d in zip(f_round, d_round, strict=True))};"
            f" other {', '.join(f'{o - d:.0f}' for o, d in zip(o_round, d_round, strict=True))};"
            f" ratio median {statistics.median(added_ratios):.2f}x ({', '.join(f'{r:.2f}' for r in added_ratios)})"
        )
        print(
            f"  connections/s: this {', '.join(f'{r:.0f}' for r in f_conn)};"
            f" other {', '.join(f'{r:.0f}' for r in o_conn)};"
            f" ratio median {statistics.median(rate_ratios):.2f}x ({', '.join(f'{r:.2f}' for r in rate_ratios)})"
        )
        o_rates = [run["bytes"] / run["seconds"] / 1e6 for run in other]
        bulk_ratios = [f / o for f, o in zip(f_rates, o_rates, strict=True)]
        print(
            f"  throughput (MB/s): this {', '.join(f'{r:.0f}' for r in f_rates)};"
            f" other {', '.join(f'{r:.0f}' for r in o_rates)};"
            f" ratio median {statistics.median(bulk_ratios):.2f}x ({', '.join(f'{r:.2f}' for r in bulk_ratios)})"
        )
        o_cpu = [run["other_cpu_us"] for run in other]
        cpu_ratios = [f / o for f, o in zip(f_cpu, o_cpu, strict=True)]
        print(
            f"  launcher and filter CPU per connection (us): this {', '.join(f'{c:.0f}' for c in f_cpu)};"
            f" other {', '.join(f'{c:.0f}' for c in o_cpu)};"
            f" ratio median {statistics.median(cpu_ratios):.2f}x ({', '.join(f'{r:.2f}' for r in cpu_ratios)})"
        )
    added = percentile(f_setup, 0.5) - percentile(d_setup, 0.5)
    print(
        f"targets: added setup p50 {added:.0f} us (< 1000 us): {'met' if added < 1000 else 'NOT met'}; "
        f"throughput {ratio:.2f}x direct (>= 0.5x): {'met' if ratio >= 0.5 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
