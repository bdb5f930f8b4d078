"""What importing a set of modules costs a small interpreter in private memory (USS).

Each argument is a line of Python run by `python -S -I` (the way the session's init and guardian
run) with the project and its virtual environment's packages on sys.path; 1.3 s after its start the
process's Private_Clean + Private_Dirty is read from /proc/PID/smaps, then it exits. The first row is
the bare interpreter. It answers "how small could a process that holds only X be" before anyone
builds it: e.g. a session supervisor that keeps only the kernel-denial reader and the audit appender.

Run: .venv/bin/python bench/import_uss.py [--tree DIR] 'import enforcer.sandbox.denials' ...
--tree: the project tree to import from (default: this one), e.g. an unpacked `git archive` with a
throwaway change.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time


def uss_mib(pid: int) -> float:
    kib = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                kib += int(line.split()[1])
    return kib / 1024


def measure(tree: str, code: str) -> float:
    prelude = f"import sys; sys.path[:0] = [{tree!r}, {site.getsitepackages()[0]!r}]\n"
    proc = subprocess.Popen([sys.executable, "-S", "-I", "-c", f"{prelude}{code}\nimport time; time.sleep(3)"], cwd="/")
    try:
        time.sleep(1.3)
        if proc.poll() is not None:
            raise SystemExit(f"{code!r} exited with {proc.returncode}")
        return uss_mib(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    args = sys.argv[1:]
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args[:1] == ["--tree"]:
        tree, args = os.path.abspath(args[1]), args[2:]
    for code in ["pass", *args]:
        print(f"{measure(tree, code):6.2f} MiB  {code}")


if __name__ == "__main__":
    main()
