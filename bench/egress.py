"""The egress filter against a direct connection, in one run, against the same test server.

Builds the tests' network lab (two namespaces and a veth; nothing on the machine's own namespace),
then runs bench/egress_client.py twice: directly in the outer namespace (by address), and inside an
adl-exec sandbox whose policy allows the server's name (DNS stub, capture, checks, relay). Prints
connection setup latency (connect until the first response byte) p50/p99, bulk throughput, and
the ratios.

Targets: added setup latency p50 under 1 ms; throughput at least half of direct.

Run (as root): .venv/bin/python bench/egress.py [CONNECTIONS] [BULK_MIB]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.netlab import NetLab  # noqa: E402
from tests.sandbox_helpers import Sandbox  # noqa: E402

CLIENT = REPO / "bench" / "egress_client.py"
PORT = 9000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    connections = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    bulk = (int(sys.argv[2]) if len(sys.argv) > 2 else 512) << 20
    if os.geteuid() != 0:
        raise SystemExit("bench/egress.py needs root (network namespaces)")
    with tempfile.TemporaryDirectory(prefix="adl-bench-egress-") as tmp:
        root = Path(tmp)
        (root / "lab").mkdir()
        lab = NetLab(root / "lab")
        try:
            lab.start()
            args = [str(CLIENT), "{host}", str(PORT), str(connections), str(bulk)]
            direct_run = lab.in_outer(sys.executable, *[a.format(host="198.51.100.10") for a in args], timeout=300)
            if direct_run.returncode != 0:
                raise SystemExit(f"direct client failed: {direct_run.stderr}")
            box = Sandbox(root / "box")
            box.wrap, box.env = lab.wrap(), lab.env()
            box.permissions["filesystem"]["allowed_paths"].append({"path": f"{REPO}/bench/**", "access": "read"})
            box.permissions["resource_limits"] = {"max_duration_sec": 300}
            box.permissions["network"] = {"allowed_hosts": ["api.example.test"], "allowed_ports": [PORT]}
            filtered_run = box.run("python3", *[a.format(host="api.example.test") for a in args], timeout=300)
            if filtered_run.code != 0:
                raise SystemExit(f"filtered client failed: {filtered_run.err}")
        finally:
            lab.stop()
    direct = json.loads(direct_run.stdout)
    filtered = json.loads(filtered_run.out)
    print(f"egress filter vs direct, {connections} new connections each, {bulk >> 20} MiB bulk")
    print(f"{'':28}{'direct':>12}{'filter':>12}{'added':>12}{'ratio':>9}")
    for label, q in (("setup p50 (us)", 0.5), ("setup p99 (us)", 0.99)):
        d, f = percentile(direct["setup_us"], q), percentile(filtered["setup_us"], q)
        print(f"{label:28}{d:12.0f}{f:12.0f}{f - d:12.0f}{f / d:8.2f}x")
    dm, fm = statistics.mean(direct["setup_us"]), statistics.mean(filtered["setup_us"])
    print(f"{'setup mean (us)':28}{dm:12.0f}{fm:12.0f}{fm - dm:12.0f}{fm / dm:8.2f}x")
    d_rate = direct["bytes"] / direct["seconds"] / 1e6
    f_rate = filtered["bytes"] / filtered["seconds"] / 1e6
    print(f"{'throughput (MB/s)':28}{d_rate:12.0f}{f_rate:12.0f}{'':12}{f_rate / d_rate:8.2f}x")
    added = percentile(filtered["setup_us"], 0.5) - percentile(direct["setup_us"], 0.5)
    print(
        f"targets: added setup p50 {added:.0f} us (< 1000 us): {'met' if added < 1000 else 'NOT met'}; "
        f"throughput {f_rate / d_rate:.2f}x direct (>= 0.5x): {'met' if f_rate / d_rate >= 0.5 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
