"""Descriptors 0, 1 and 2 held open before a command opens anything of its own.

adl-exec hands its descriptors 0-2 to the agent as its stdin, stdout and stderr (to the stage, or
to the daemon over the launch socket). Started with one of them closed, the next descriptor it
opened would take that number: its end of the guardian's socket, a stage socket, its connection
to the daemon or the session file, handed to the agent as if it were the caller's terminal. The
guardian (root, outside the sandbox) obeys the last frame written on its socket. So a command run
as such fills a closed 0-2 with /dev/null first, as setuid programs do.
"""

from __future__ import annotations

import os


def open_standard_streams() -> None:
    """Point each closed descriptor among 0, 1 and 2 at /dev/null (open ones are left alone)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            # The lowest free number: this one, as every lower one is open by now.
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # cannot happen while the lower ones are open; never leave it elsewhere
                os.dup2(null, fd)
                os.close(null)
