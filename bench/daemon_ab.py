"""The daemon's side of a launch, this tree against another tree of the project, in one run.

Two adl-enforcerd run side by side (the tests' daemon set-up, each in its own temporary directory):
this tree's and OTHER_TREE's (PYTHONPATH, e.g. an unpacked `git archive` with its generated
`enforcer/v1`). Each round runs, in a rotated order, `python -c pass` and `adl-exec --daemon --
/bin/true` against each daemon, with this tree's client for both, so that only the daemons differ.
Prints median ms, the median (range) of the per-round ratios, and the CPU time each daemon spent
per launch: its own and its spawner's, children included (every supervisor, stage, guard and
agent is reaped below the spawner). On a shared machine the CPU time moves less with the load
than the wall time does. Bytecode caching stays on, as for an installed package.

Run (as root, from any directory but a tree of the project, so that `-m` finds each daemon's own
code): .venv/bin/python /path/to/bench/daemon_ab.py OTHER_TREE [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def daemon_cpu_s(pid: int) -> float:
    """The daemon's and its spawner's (its only child)."""
    (spawner,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return cpu_s(pid) + cpu_s(int(spawner))


def main() -> None:
    sys.path.insert(0, str(REPO))
    from tests.helpers.daemon import RunningDaemon
    from tests.helpers.sandbox import Sandbox, agent_tmp_dir

    other, rounds = os.path.abspath(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 15
    if Path.cwd().resolve() in (REPO, Path(other).resolve()):
        raise SystemExit("run it from another directory: `-m` would find that tree's code first")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with agent_tmp_dir() as tmp:
        daemons = {}
        for name in ("other tree", "this tree"):
            root = Path(tmp) / name.replace(" ", "-")
            root.mkdir()
            daemon = RunningDaemon(root, Sandbox(root / "box"))
            daemon.box.permissions["execution"]["allowed_commands"] = ["true"]
            daemon.write_agents(max_concurrent=None)
            if name == "other tree":
                daemon.extra_env["PYTHONPATH"] = other
            daemons[name] = daemon
        try:
            for daemon in daemons.values():
                daemon.start()
            commands = {"python -c pass": [sys.executable, "-c", "pass"]}
            commands.update({f"daemon, {name}": d.exec_argv("/bin/true") for name, d in daemons.items()})
            for argv in commands.values():
                for _ in range(2):
                    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
            time.sleep(0.5)  # the warm-up's supervisors reaped
            pids = {name: d.proc.pid for name, d in daemons.items() if d.proc is not None}
            before = {name: daemon_cpu_s(pid) for name, pid in pids.items()}
            names = list(commands)
            samples: dict[str, list[float]] = {name: [] for name in names}
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    start = time.perf_counter()
                    subprocess.run(commands[name], env=env, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
                    samples[name].append((time.perf_counter() - start) * 1000)
            time.sleep(0.5)  # the last supervisors reaped
            after = {name: daemon_cpu_s(pid) for name, pid in pids.items()}
        finally:
            for daemon in daemons.values():
                daemon.cleanup()

    def ratio(name: str, base: str) -> str:
        per_round = [a / b for a, b in zip(samples[name], samples[base], strict=True)]
        return f"{statistics.median(per_round):5.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"

    print(f"whole runs, {rounds} interleaved rounds: median ms; per-round ratio median (range)")
    for name in names:
        median = statistics.median(samples[name])
        print(f"  {name:<20} {median:8.1f}   vs python -c pass {ratio(name, 'python -c pass')}")
    print(f"  this tree's daemon vs the other tree's, per round: {ratio('daemon, this tree', 'daemon, other tree')}")
    for name in pids:
        print(f"  CPU per launch, {name}'s daemon and spawner: {1000 * (after[name] - before[name]) / rounds:.1f} ms")


if __name__ == "__main__":
    main()
