"""Where the API process runs. Its Python work is serialised by the interpreter lock, and every RPC
hands work between gRPC's threads: keeping all of them on one CPU saves the cross-CPU wake-ups, so
"one" is the default (bench/RESULTS.md has the comparison). The spawner, and so every session, is
forked before this is applied and keeps the CPUs it was given."""

from __future__ import annotations

import os
import re

CPU_LIST = re.compile(r"^\d+(,\d+)*$")


def validate(setting: str) -> str:
    if setting in ("one", "all") or CPU_LIST.match(setting):
        return setting
    raise ValueError('"one", "all", or a comma-separated list of CPU numbers')


def chosen_cpus(setting: str, allowed: set[int]) -> set[int] | None:
    """The CPUs for the API process, or None to leave it where it is."""
    if setting == "all":
        return None
    if setting == "one":
        return {max(allowed)}
    cpus = {int(n) for n in setting.split(",")}
    if not cpus <= allowed:
        raise ValueError(f"api_cpus {setting!r} names CPUs this process may not use (allowed: {sorted(allowed)})")
    return cpus


def pin_this_process(setting: str) -> set[int] | None:
    """Apply `setting` to every thread of this process; the CPUs chosen, or None."""
    cpus = chosen_cpus(setting, os.sched_getaffinity(0))
    if cpus is not None:
        for task in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(task), cpus)
    return cpus
