"""Which process forked which, as the kernel's process events connector reports them (learn mode).

fanotify names the process behind an event only by its pid, and the learner tells the session's
processes from the host's by reading /proc/PID/cgroup when it reads the event. A short-lived process
(`git status` run by the agent) may be gone by then, and its execution would go unlearned. The
connector (NETLINK_CONNECTOR, CN_IDX_PROC; root only) queues a fork event when the fork happens, so
a pid that is gone can still be traced to a parent known to be in the session. The structures
below are linux/connector.h's and linux/cn_proc.h's; the netlink framing is netlink.py's. The
connector answers only in the host's first network namespace: a launcher started in another
one (the tests' network lab) gets ECONNREFUSED, and learn mode says its result may miss processes
that ended at once.
"""

from __future__ import annotations

import socket
import struct

from . import netlink

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_FORK = 0x1
_CN_MSG = struct.Struct("=IIIIHH")  # id.idx, id.val, sequence, ack, payload length, flags
_EVENT_HEADER = struct.Struct("=IIQ")  # what, cpu, timestamp
_FORK_AT = _CN_MSG.size + _EVENT_HEADER.size  # where a fork event's pids start in its payload
_FORK = struct.Struct("=iiii")  # parent pid, parent tgid, child pid, child tgid
_RECEIVE_BUFFER = 4 << 20  # bursts of forks on the host while the learner is busy


class ForkEvents:
    """A subscription to the kernel's fork events; read() returns (parent, child) process ids of
    the new processes (threads left out) queued since the last read. `lost` is set when the queue
    overflowed: some forks went unseen."""

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, 33, _RECEIVE_BUFFER)  # SO_RCVBUFFORCE: root may
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
            sock.bind((0, CN_IDX_PROC))
            body = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, 4, 0) + struct.pack("=I", PROC_CN_MCAST_LISTEN)
            sock.send(netlink.message(netlink.NLMSG_DONE, 0, 0, body))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.lost = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[tuple[int, int]]:
        forks: list[tuple[int, int]] = []
        while True:
            try:
                message, (sender, _) = self.sock.recvfrom(65536)
            except BlockingIOError:
                return forks
            except OSError:  # ENOBUFS: the queue overflowed
                self.lost = True
                continue
            if sender != 0:
                continue  # only the kernel reports forks
            for _, _, payload in netlink.messages(message):
                if len(payload) < _FORK_AT + _FORK.size:
                    continue
                if _EVENT_HEADER.unpack_from(payload, _CN_MSG.size)[0] == PROC_EVENT_FORK:
                    _, parent_tgid, child_pid, child_tgid = _FORK.unpack_from(payload, _FORK_AT)
                    if child_pid == child_tgid:  # a new process, not a thread
                        forks.append((parent_tgid, child_tgid))

    def close(self) -> None:
        self.sock.close()
