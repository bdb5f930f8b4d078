"""The egress filter's process, one per session that is granted network access.

Forked by the launching process before the agent: it creates the agent's network namespace with its
listeners (netns.py), hands the namespace to the launcher over a socketpair (SCM_RIGHTS), then loads
its serving half (server.py) and serves DNS and TCP until the launcher says stop (or dies:
PDEATHSIG; a filter whose launcher died before it could set it ends at once). The launcher imports
only this module: dnspython and the connection filter are loaded by the filter's process, after
"ready", alongside the launch. It writes its own records to the same audit log with its own
writer, like every other process that writes there. It holds no capability while it serves; the
launcher reads the namespace's drop counters and hands them over with "stop".
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import ipaddress
import json
import os
import signal
import socket
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..audit import WriterSettings
from ..command_start import drop_working_directory
from ..egress_values import EgressValues
from ..policy import Policy
from ..sandbox import namespaces, pidns
from ..sandbox.stage import close_all_but
from . import netns

PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class EgressError(Exception):
    """The filter could not be set up: the session must not start."""


@dataclass
class AuditTarget:
    """Where the filter's own writer appends: the session's log."""

    directory: Path
    key_path: Path
    settings: WriterSettings


@dataclass
class EgressProcess:
    pid: int
    netns_fd: int
    control: socket.socket

    def stop(self) -> dict[str, Any]:
        """End the filter (open connections are cut) and return its summary."""
        summary: dict[str, Any] = {"error": "the egress filter ended without its summary"}
        try:
            self.control.settimeout(STOP_TIMEOUT_S)
            try:
                dropped: dict[str, Any] = netns.read_counters(self.netns_fd)
            except OSError as exc:
                dropped = {"error": str(exc)}
            with contextlib.suppress(OSError):  # a filter that failed may be gone: its error is still queued
                self.control.send(b"stop " + json.dumps(dropped).encode())
            with contextlib.suppress(OSError, ValueError):
                reply = self.control.recv(65536)
                if reply.startswith(b"error "):
                    # It failed after "ready": it served nothing (no listener was left to take a
                    # connection), and the session's exit record says why.
                    detail = reply.removeprefix(b"error ").decode(errors="replace").strip()
                    summary = {"error": f"the egress filter failed after it started: {detail}"}
                elif reply:
                    summary = json.loads(reply)
        finally:
            self.control.close()
            os.close(self.netns_fd)
            with contextlib.suppress(ChildProcessError):  # a subreaper launcher may have collected it
                os.waitpid(self.pid, 0)
        return summary


def host_addresses() -> list[str]:
    """The enforcer's own addresses (in the namespace it dials from): never reachable for an agent."""
    return netns.interface_addresses()


def start(policy: Policy, settings: EgressValues, audit: AuditTarget, session: str) -> EgressProcess:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    # Taken before the fork: opened in the filter, the parent's pid could already be its adopter's.
    launcher = os.pidfd_open(os.getpid())
    try:
        pid = os.fork()
    except OSError:
        os.close(launcher)
        ours.close()
        theirs.close()
        raise
    if pid == 0:
        code = 1
        try:
            ours.close()
            pidns.die_with(launcher)  # a launcher gone before this: nothing of the filter's is started
            code = _serve(theirs, policy, settings, audit, session)
        except BaseException:
            with contextlib.suppress(OSError):
                theirs.send(b"error " + traceback.format_exc(limit=3).encode()[-3000:])
        finally:
            os._exit(code)
    os.close(launcher)
    theirs.close()
    ours.settimeout(START_TIMEOUT_S)
    try:
        message, fds, _, _ = socket.recv_fds(ours, 65536, 1, socket.MSG_CMSG_CLOEXEC)
    except OSError as exc:
        message, fds = f"error no answer from the egress filter: {exc}".encode(), []
    if message != b"ready" or not fds:
        for fd in fds:
            os.close(fd)
        ours.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        detail = message.decode(errors="replace").removeprefix("error ").strip() or "it exited"
        raise EgressError(f"the egress filter did not start: {detail}")
    return EgressProcess(pid, fds[0], ours)


def _serve(control: socket.socket, policy: Policy, settings: EgressValues, audit: AuditTarget, session: str) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # the terminal's signals are for the agent; the launcher stops us
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # failures are audited; the agent's terminal is the agent's
    close_all_but({0, 1, 2, control.fileno()})

    own = host_addresses()
    test_ranges = [ipaddress.ip_network(n, strict=False) for n in settings.public_test_ranges]
    policy = dataclasses.replace(
        policy,
        host_ips=tuple(ipaddress.ip_address(a) for a in own),
        public_test_networks=tuple(test_ranges) + tuple(policy.public_test_networks),
    )
    space = netns.create()
    # Everything privileged is done: the process that parses what the agent sends keeps no
    # capabilities (uid 0 still owns the audit files it appends to) and can never regain any.
    namespaces.drop_privileges(None, None)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # What this process imports from here on, it imports while the agent runs: never from a
    # directory the agent may write to.
    drop_working_directory()
    started: dict[str, Any] = {
        "public_test_ranges": [str(n) for n in test_ranges],
        "ipv6": space.ipv6,
        "host_addresses": own,
    }
    if test_ranges:
        started["warning"] = (
            "ADL_ENFORCER_PUBLIC_TEST_RANGES treats documentation ranges as public addresses (test networks only)"
        )
    # Ready once the listeners exist: the launch goes on while this process loads what serves them
    # and records net.start (the kernel queues the agent's connections and queries until then). A
    # failure from here on leaves no listener, so nothing leaves the namespace, and the launcher's
    # "stop" gets the error instead of a summary.
    socket.send_fds(control, [b"ready"], [space.netns_fd])
    from .server import serve

    serve(control, space, policy, settings, (audit.directory, audit.key_path, audit.settings), session, started)
    space.close()
    return 0
