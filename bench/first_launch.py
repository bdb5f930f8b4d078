"""What a compiled-policy cache miss adds to a launch, this tree against another, interleaved.

Each sample is a fresh interpreter (bytecode caching on, as for an installed package) that imports
what every embedded launch imports (enforcer.launching, the host's features), then times one
policy_cache.load() of POLICY with the packaged region map and baseline: with the cache off (a
miss: read, validate, compile) or from a warm cache (a hit). Each round runs the four cases
(this tree and OTHER_TREE, miss and hit) in a rotated order. Prints, per tree, the median and
quartiles of the miss, of the hit, and of the per-round difference (what a miss adds), and the
per-round ratio of this tree's miss to the other's.

Run (as root, for the kernel keyring the cache's MAC key lives in):
  .venv/bin/python bench/first_launch.py OTHER_TREE POLICY.adl.json [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, time
import enforcer.launching
from pathlib import Path
from enforcer import data, policy_cache
from enforcer.session import host_features

features = host_features()
cache = None if sys.argv[2] == "off" else Path(sys.argv[2])
start = time.perf_counter()
loaded = policy_cache.load(
    Path(sys.argv[1]), None, None, data.RUNTIME_BASELINE,
    production=False, home_region=None, features=features, directory=cache,
)
elapsed = (time.perf_counter() - start) * 1000
assert loaded.status == ("off" if cache is None else "hit"), loaded.status
print(elapsed)
"""


def main() -> None:
    other, policy = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    this = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="adl-bench-first-") as tmp:
        cases = {
            (tree, mode): [sys.executable, "-c", CHILD, policy, "off" if mode == "miss" else f"{tmp}/cache-{name}"]
            for name, tree in (("this", this), ("other", other))
            for mode in ("miss", "hit")
        }
        trees = {"this": this, "other": other}

        def run(key: tuple[str, str]) -> float:
            tree = key[0]
            out = subprocess.run(
                cases[key], env={**env, "PYTHONPATH": tree}, cwd=tmp, capture_output=True, text=True, check=True
            )
            return float(out.stdout)

        # Fill each tree's cache (the first load misses and writes the entry), write bytecode.
        for name, tree in trees.items():
            subprocess.run(
                [sys.executable, "-c", CHILD.replace('("off" if cache is None else "hit")', "loaded.status"),
                 policy, f"{tmp}/cache-{name}"],
                env={**env, "PYTHONPATH": tree}, cwd=tmp, check=True, capture_output=True,
            )  # fmt: skip
            run((tree, "miss"))
            run((tree, "hit"))
        keys = list(cases)
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        for r in range(rounds):
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                samples[key].append(run(key))

    def summary(values: list[float]) -> str:
        q = statistics.quantiles(values, n=4)
        return f"{statistics.median(values):6.1f} ms (quartiles {q[0]:.1f}, {q[2]:.1f})"

    print(f"policy_cache.load of {policy}, {rounds} interleaved rounds")
    for name, tree in trees.items():
        miss, hit = samples[(tree, "miss")], samples[(tree, "hit")]
        print(f"  {name} tree: miss {summary(miss)}  hit {summary(hit)}")
        print(f"  {name} tree: a miss adds {summary([m - h for m, h in zip(miss, hit, strict=True)])}")
    ratios = [a / b for a, b in zip(samples[(this, "miss")], samples[(other, "miss")], strict=True)]
    print(f"  miss, this tree vs other tree: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
