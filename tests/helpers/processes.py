"""Processes as the tests look at them from outside."""

from __future__ import annotations

import time
from collections.abc import Callable


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a process that exited but was not collected yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def until(condition: Callable[..., object], seconds: float, every_s: float = 0.02) -> bool:
    """Whether `condition` holds within `seconds`, asked every `every_s`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return bool(condition())
