"""adl-exec of this tree against another tree of the project, interleaved, in one run.

Each round runs, in a rotated order: `python -c pass`; adl-exec from OTHER_TREE (PYTHONPATH, e.g. an
unpacked `git archive` of an earlier commit); adl-exec from this tree with its compiled-policy cache
warm; and with the cache off; and OTHER_TREE's with the cache off. Prints median ms and the median
(range) of the per-round ratios to `python -c pass` and to the other tree, this tree's cache-off
runs against the other tree's, and per tree what a cache miss adds to a run (off minus warm).
Bytecode caching stays on, as for an installed package.

Run (as root): .venv/bin/python bench/launch_ab.py OTHER_TREE POLICY.adl.json [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    other, policy = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    with tempfile.TemporaryDirectory(prefix="adl-bench-ab-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(
            ADL_ENFORCER_AUDIT_DIR=f"{tmp}/audit",
            ADL_ENFORCER_AUDIT_KEY=f"{tmp}/key.pem",
            ADL_ENFORCER_CACHE_DIR=f"{tmp}/cache",
        )
        adl_exec = [
            sys.executable,
            "-m",
            "enforcer.cli.exec",
            "--adl",
            policy,
            "--user",
            "65534:65534",
            "--",
            "/bin/true",
        ]
        variants = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            # Its own cache: trees may key and evict entries differently.
            "other tree": (adl_exec, {**env, "PYTHONPATH": other, "ADL_ENFORCER_CACHE_DIR": f"{tmp}/cache-other"}),
            "this tree, cache warm": (adl_exec, env),
            "this tree, cache off": (adl_exec, {**env, "ADL_ENFORCER_CACHE_DIR": "off"}),
            "other tree, cache off": (adl_exec, {**env, "PYTHONPATH": other, "ADL_ENFORCER_CACHE_DIR": "off"}),
        }
        # `python -m` puts the working directory first on sys.path: run from the temporary
        # directory, or a run from inside this tree would import this tree as the other one.
        for argv, environ in variants.values():  # bytecode, page cache, policy cache
            subprocess.run(argv, env=environ, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
        names = list(variants)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                argv, environ = variants[name]
                start = time.perf_counter()
                subprocess.run(argv, env=environ, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
                samples[name].append((time.perf_counter() - start) * 1000)

    def ratio(name: str, base: str) -> str:
        per_round = [a / b for a, b in zip(samples[name], samples[base], strict=True)]
        return f"{statistics.median(per_round):5.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"

    def added(name: str, base: str) -> str:
        per_round = [a - b for a, b in zip(samples[name], samples[base], strict=True)]
        quartiles = statistics.quantiles(per_round, n=4)
        return f"{statistics.median(per_round):.1f} ms (quartiles {quartiles[0]:.1f}, {quartiles[2]:.1f})"

    print(f"adl-exec -- /bin/true, {rounds} interleaved rounds: median ms; per-round ratios median (range)")
    for name in names:
        print(
            f"  {name:<22} {statistics.median(samples[name]):7.1f} ms  vs python -c pass "
            f"{ratio(name, 'python -c pass')}"
            f"   vs other tree {ratio(name, 'other tree')}"
        )
    print(f"  cache off, this tree vs other tree {ratio('this tree, cache off', 'other tree, cache off')}")
    print(
        "  what a miss adds (cache off minus warm, per round): "
        f"this tree {added('this tree, cache off', 'this tree, cache warm')}, "
        f"other tree {added('other tree, cache off', 'other tree')}"
    )


if __name__ == "__main__":
    main()
