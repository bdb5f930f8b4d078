"""Processes as the tests look at them from outside."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a process that exited but was not collected yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
