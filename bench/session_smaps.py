"""Where an embedded session's private memory is: each enforcer process's USS by mapping.

Runs `adl-exec --adl P --user 65534:65534 -- sleep 3` (P allows `sleep`, no network; its policy
cache filled by a first run), and 1.5 s in reads /proc/PID/smaps of adl-exec and every process under
it but `sleep`: Private_Clean + Private_Dirty summed per mapping (anonymous memory, the heap, each
file). This script imports nothing of the project: a page of a shared library that this process
also mapped would not be private to the enforcer's process (bench/launch.py's memory rows import
the project, cryptography's Rust module among it, and so count its pages as shared).

Run (as root): .venv/bin/python bench/session_smaps.py [ROUNDS [OTHER_TREE]]
OTHER_TREE (PYTHONPATH, e.g. an unpacked `git archive` with its generated enforcer/v1) is measured in
alternate rounds, with a policy cache of its own.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

POLICY = {
    "adl_spec": "0.3.0",
    "name": "Bench",
    "description": "runs sleep",
    "version": "1.0.0",
    "data_classification": {"sensitivity": "internal"},
    "permissions": {
        "filesystem": {"allowed_paths": [{"path": "/tmp/**", "access": "read"}], "denied_paths": []},
        "execution": {"allowed_commands": ["sleep"], "allow_shell": False},
        "resource_limits": {"max_memory_mb": 64, "max_duration_sec": 10},
    },
}
FIELDS = ("Private_Clean:", "Private_Dirty:")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def private_kib_by_mapping(pid: int) -> collections.Counter[str]:
    by_mapping: collections.Counter[str] = collections.Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):  # a mapping's header line
                path = parts[5] if len(parts) > 5 else "[anon]"
                name = os.path.basename(path) if path.startswith("/") else path
            elif parts[0] in FIELDS:
                by_mapping[name] += int(parts[1])
    return by_mapping


def role(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    if b"enforcer.cli.exec" in argv:
        return "adl-exec"
    code = argv[4] if len(argv) > 4 and argv[1:4] == [b"-S", b"-I", b"-c"] else b""
    if b"PID namespace" in code[:200]:
        return "init"
    if b"guardian" in code[:200]:
        return "guardian"
    return os.path.basename(argv[0]).decode(errors="replace")


def session(argv: list[str], env: dict[str, str], cwd: str) -> list[tuple[str, collections.Counter[str]]]:
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        rows = []
        for pid in descendants(proc.pid):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "sleep":
                        continue
                rows.append((role(pid), private_kib_by_mapping(pid)))
            except OSError:
                continue
        return rows
    finally:
        proc.wait(timeout=30)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    trees = {"this tree": None, **({"other tree": sys.argv[2]} if len(sys.argv) > 2 else {})}
    with tempfile.TemporaryDirectory(prefix="adl-bench-smaps-") as tmp:
        policy = os.path.join(tmp, "sleep.adl.json")
        with open(policy, "w") as f:
            json.dump(POLICY, f)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(ADL_ENFORCER_AUDIT_DIR=f"{tmp}/audit", ADL_ENFORCER_AUDIT_KEY=f"{tmp}/key.pem")
        # From the temporary directory: `python -m` puts the working directory first on sys.path.
        argv = [sys.executable, "-m", "enforcer.cli.exec", "--adl", policy, "--user", "65534:65534", "--", "sleep"]
        for r in range(-1, rounds):  # round -1 fills each tree's policy cache, unreported
            for tree, path in trees.items():
                environ = {**env, "ADL_ENFORCER_CACHE_DIR": f"{tmp}/cache-{tree.split()[0]}"}
                if path:
                    environ["PYTHONPATH"] = path
                if r < 0:
                    subprocess.run([*argv, "0"], env=environ, check=True, cwd=tmp)
                    continue
                rows = session([*argv, "3"], environ, tmp)
                total = sum(sum(m.values()) for _, m in rows)
                print(f"round {r + 1}, {tree}: USS {total / 1024:.1f} MiB summed")
                for name, mappings in rows:
                    top = ", ".join(f"{k} {v / 1024:.2f}" for k, v in mappings.most_common(7) if v >= 100)
                    print(f"  {name:<9} {sum(mappings.values()) / 1024:5.1f}  {top}")


if __name__ == "__main__":
    main()
