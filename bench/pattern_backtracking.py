"""Time PatternList.match of a path pattern with k '*' in one segment against an n-character near
miss (the case a backtracking matcher takes n^k steps for).

    .venv/bin/python bench/pattern_backtracking.py            # this tree
    PYTHONPATH=/tmp/old .venv/bin/python bench/pattern_backtracking.py   # another tree's enforcer/
"""

from __future__ import annotations

import sys
import time

from enforcer.policy.patterns import PatternList

CASES = [(3, 200), (4, 100), (4, 200), (5, 100), (6, 50), (20, 255)]
LIMIT_S = 30.0  # cases after one that took this long are not run (the next ones take longer)


def main() -> int:
    print(f"enforcer from {sys.modules['enforcer'].__file__}")
    for stars, length in CASES:
        patterns = PatternList.compile(["/data/" + "*a" * stars + "*b*"], "path")
        value = "/data/" + "a" * length
        started = time.perf_counter()
        assert patterns.match(value) == []
        took = time.perf_counter() - started
        print(f"k={stars:<3} n={length:<4} {took * 1000:10.3f} ms", flush=True)
        if took > LIMIT_S:
            print("stopped: the next cases take longer still")
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
