"""sd_notify: READY, RELOADING, STOPPING, STATUS and WATCHDOG messages to systemd.

Hand-written because it is one datagram on $NOTIFY_SOCKET; the PyPI wrappers either need libsystemd
or are unmaintained. Without NOTIFY_SOCKET (not under systemd) every call does nothing. The
command reads systemd's variables (`Systemd.from_environment`) and hands the result down.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Systemd:
    notify_socket: str | None = None  # None: not under systemd, nothing is sent
    watchdog_s: float = 0.0  # seconds between pings systemd expects (WatchdogSec=); 0: no watchdog

    @staticmethod
    def from_environment(environ: Mapping[str, str], pid: int) -> Systemd:
        usec = environ.get("WATCHDOG_USEC", "")
        owner = environ.get("WATCHDOG_PID", "")
        watchdog = int(usec) / 1_000_000 if usec.isdigit() and (not owner or owner == str(pid)) else 0.0
        return Systemd(environ.get("NOTIFY_SOCKET") or None, watchdog)

    def send(self, *fields: str) -> bool:
        address = self.notify_socket
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
