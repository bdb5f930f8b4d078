"""The cost of seccomp.limits_shield (the agent's filter that keeps prlimit off the creation guard):
building and loading it after the baseline, and two calls under both filters against the baseline
alone: getppid (cached by the kernel as always allowed) and getrlimit (glibc's prlimit64, which the
shield's program runs for). Each variant in a fresh child, `rounds` times.

    .venv/bin/python bench/limits_shield.py [rounds]
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time

from enforcer.sandbox import seccomp

PR_SET_NO_NEW_PRIVS = 38
CALLS = 500_000


def _child(shield: bool) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    seccomp.load(seccomp.compile_filter(seccomp.variants()[-1]), listener=False)
    loaded_us = 0.0
    if shield:
        started = time.perf_counter_ns()
        seccomp.load(seccomp.limits_shield([4, 5]), listener=False)
        loaded_us = (time.perf_counter_ns() - started) / 1000
    started = time.perf_counter_ns()
    for _ in range(CALLS):
        os.getppid()
    getppid_ns = (time.perf_counter_ns() - started) / CALLS
    started = time.perf_counter_ns()
    for _ in range(CALLS):
        resource.getrlimit(resource.RLIMIT_NOFILE)
    getrlimit_ns = (time.perf_counter_ns() - started) / CALLS
    print(
        f"shield={shield!s:5} build+load {loaded_us:6.1f} us  "
        f"getppid {getppid_ns:4.0f} ns  getrlimit {getrlimit_ns:4.0f} ns"
    )


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for _ in range(rounds):
        for shield in (False, True):
            pid = os.fork()
            if pid == 0:
                try:
                    _child(shield)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
