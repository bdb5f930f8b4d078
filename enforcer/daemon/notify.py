"""sd_notify: READY, RELOADING, STOPPING, STATUS and WATCHDOG messages to systemd.

Hand-written because it is one datagram on $NOTIFY_SOCKET; the PyPI wrappers either need libsystemd
or are unmaintained. Without NOTIFY_SOCKET (not under systemd) every call does nothing.
"""

from __future__ import annotations

import os
import socket


def send(*fields: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto("\n".join(fields).encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval() -> float:
    """Seconds between pings systemd expects (WatchdogSec=), or 0 when the watchdog is off."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or (pid and pid != str(os.getpid())):
        return 0.0
    return int(usec) / 1_000_000
