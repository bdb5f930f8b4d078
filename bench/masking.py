"""Masking a tool call's arguments for the audit record, by argument size, in one run.

Every Check of a tool call masks its arguments before the record is written: each string is
searched for secrets and PII. The arguments here are a `write_file` call whose `content` is
code-like text (words, numbers, punctuation; no secret or PII in it) of 1, 10 and 60 KB. The
baseline, measured in the same run, is what masking cannot avoid: the canonical JSON of the
arguments and its SHA-256 (the record's `args_digest`). Prints the median time of each and their
ratio.

Run: .venv/bin/python bench/masking.py [ROUNDS]
"""

from __future__ import annotations

import hashlib
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from enforcer.audit.masking import Masker
from enforcer.audit.records import canonical

WORDS = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "else", "x", "y", "data"]
NUMBERS = ["2024", "42", "0.5", "(1, 2)", "-1", "3.14"]


def code_like(size: int, rng: random.Random) -> str:
    """About one token in five a number, never two in a row (a run of numbers can read as a phone
    number, which would then be masked)."""
    tokens: list[str] = []
    while sum(map(len, tokens)) + len(tokens) < size:
        number = tokens and tokens[-1] in WORDS and rng.random() < 0.25
        tokens.append(rng.choice(NUMBERS) if number else rng.choice(WORDS))
    return " ".join(tokens)[:size]


def median_us(run: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rng = random.Random(1)
    masker = Masker()
    print(f"{'content':>9} {'mask µs':>10} {'digest µs':>10} {'ratio':>7}")
    for size in (1_000, 10_000, 60_000):
        arguments = {"path": "src/app.py", "content": code_like(size, rng)}
        assert masker.mask(arguments).pointers == ()  # nothing to mask: the whole cost is the search
        masked = median_us(lambda a=arguments: masker.mask(a), rounds)
        digest = median_us(lambda a=arguments: hashlib.sha256(canonical(a)).hexdigest(), rounds)
        print(f"{size:>7} B {masked:>10.1f} {digest:>10.1f} {masked / digest:>6.1f}x")


if __name__ == "__main__":
    main()
