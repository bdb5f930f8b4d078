"""Launch cost: adl-exec against bwrap and a bare /bin/true, in one run (needs root and bubblewrap).

Prints medians of N runs for:
  bare         /bin/true (fork + exec from this process)
  bwrap        bwrap --unshare-all --ro-bind / / /bin/true, whole run
  adl-exec     the adl-exec command, whole run (interpreter start-up, imports, audit log included)
  interpreter  python -c pass, and python -c 'import enforcer.cli.exec' (the import path adl-exec pays)
  setup        in-process: build the plan and run /bin/true in the sandbox (cgroup, guardian, namespaces,
               masks, Landlock, seccomp, wait, cleanup): sandbox setup without interpreter start-up

Run: .venv/bin/python bench/launch.py [N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from enforcer.documents import load_policy
from enforcer.sandbox import launcher
from enforcer.sandbox.plan import build_plan, load_baseline
from enforcer.sandbox.session import host_features, new_session_id

REPO = Path(__file__).resolve().parent.parent
POLICY = {
    "adl_spec": "0.3.0",
    "name": "Bench",
    "description": "runs /bin/true",
    "version": "1.0.0",
    "data_classification": {"sensitivity": "internal"},
    "permissions": {
        "filesystem": {"allowed_paths": [{"path": "/tmp/**", "access": "read"}], "denied_paths": []},
        "execution": {"allowed_commands": ["true"], "allow_shell": False},
        "resource_limits": {"max_memory_mb": 64, "max_duration_sec": 10},
    },
}


def median_ms(fn: Callable[[], object], n: int) -> float:
    fn()  # warm caches
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    with tempfile.TemporaryDirectory() as tmp:
        policy_path = Path(tmp) / "bench.adl.json"
        policy_path.write_text(json.dumps(POLICY))
        env = {**os.environ, "ADL_ENFORCER_AUDIT_DIR": f"{tmp}/audit", "ADL_ENFORCER_AUDIT_KEY": f"{tmp}/key.pem"}
        adl_exec = [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(policy_path), "--", "/bin/true"]
        policy = load_policy(policy_path)
        baseline = load_baseline(REPO / "policies" / "runtime-baseline.yaml")
        features = host_features()

        def setup() -> None:
            plan = build_plan(policy, ["/bin/true"], baseline=baseline, environ={}, features=features)
            outcome = launcher.run(plan, new_session_id())
            assert outcome.exit_code == 0

        results = {
            "bare /bin/true": median_ms(lambda: run(["/bin/true"]), n),
            "bwrap --unshare-all": median_ms(
                lambda: run(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "/bin/true"]), n
            ),
            "adl-exec (whole run)": median_ms(lambda: run(adl_exec, env), n),
            "python -c pass": median_ms(lambda: run([sys.executable, "-c", "pass"]), n),
            "python -c 'import enforcer.cli.exec'": median_ms(
                lambda: run([sys.executable, "-c", "import enforcer.cli.exec"]), n
            ),
            "sandbox setup, in-process": median_ms(setup, n),
        }
    bwrap = results["bwrap --unshare-all"]
    print(f"medians of {n} runs (ms); ratio against bwrap's whole run")
    for name, value in results.items():
        print(f"  {name:<40} {value:8.2f}  {value / bwrap:6.2f}x")


if __name__ == "__main__":
    main()
