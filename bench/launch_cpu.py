"""A warm embedded launch of this tree against another tree, in CPU time as well as wall time.

On a shared machine wall time mostly measures the other jobs; CPU time (user + system, of adl-exec
and of every process it reaped: stage, PID-namespace init, guardian, guard) moves much less. Two
interleaved measurements, each tree with its own warm policy cache:

- imports: a fresh interpreter importing what a warm launch imports before it plans
  (enforcer.cli.exec, enforcer.sandbox.stage, enforcer.cli.exec_embedded), timed inside it;
- launches: whole `adl-exec --adl POLICY --user 65534:65534 -- /bin/true` runs.

Bytecode caching stays on, as for an installed package.

Run (as root): .venv/bin/python bench/launch_cpu.py OTHER_TREE POLICY.adl.json [ROUNDS]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

IMPORTS = (
    "import time; w, c = time.perf_counter(), time.process_time(); "
    "import enforcer.cli.exec, enforcer.sandbox.stage, enforcer.cli.exec_embedded; "
    "print((time.perf_counter() - w) * 1000, (time.process_time() - c) * 1000)"
)


def _launch(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def _imports(env: dict[str, str], cwd: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", IMPORTS], env=env, cwd=cwd, check=True, capture_output=True)
    wall, cpu = out.stdout.split()
    return float(wall), float(cpu)


def _report(label: str, samples: dict[str, list[tuple[float, float]]]) -> None:
    for index, unit in ((0, "wall"), (1, "CPU")):
        this = [s[index] for s in samples["this"]]
        other = [s[index] for s in samples["other"]]
        ratios = [a / b for a, b in zip(this, other, strict=True)]
        print(
            f"  {label:<9} {unit:<4} this {statistics.median(this):6.1f} ms, other {statistics.median(other):6.1f} ms,"
            f" this/other per round {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main() -> None:
    other, policy = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="adl-bench-cpu-") as tmp:
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base.update(ADL_ENFORCER_AUDIT_DIR=f"{tmp}/audit", ADL_ENFORCER_AUDIT_KEY=f"{tmp}/key.pem")
        trees = {
            name: {**base, "PYTHONPATH": path, "ADL_ENFORCER_CACHE_DIR": f"{tmp}/cache-{name}"}
            for name, path in (("this", this), ("other", other))
        }
        argv = [sys.executable, "-m", "enforcer.cli.exec", "--adl", policy, "--user", "65534:65534", "--", "/bin/true"]
        for env in trees.values():  # bytecode, page cache, policy cache
            _launch(argv, env, tmp)
            _imports(env, tmp)
        launches: dict[str, list[tuple[float, float]]] = {"this": [], "other": []}
        imports: dict[str, list[tuple[float, float]]] = {"this": [], "other": []}
        for r in range(rounds):
            # From the temporary directory: `python -m` puts the working directory first on sys.path.
            for name in ("this", "other") if r % 2 else ("other", "this"):
                imports[name].append(_imports(trees[name], tmp))
                launches[name].append(_launch(argv, trees[name], tmp))
    print(f"warm embedded launch, {rounds} interleaved rounds, medians; this tree {this}, other {other}")
    _report("imports", imports)
    _report("launches", launches)


if __name__ == "__main__":
    main()
