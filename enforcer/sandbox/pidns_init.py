"""The init of a session's PID namespace as a small interpreter of its own (pidns.py).

pidns.fork_init, for a stage forked ahead by a launcher of its own (adl-exec), execs
`python -S -I -c CODE AGENT STATUS_FD JOINED_FD JOIN_FILE...` in the init it forked, once init has
forked the future agent (pid 2) and seen the stage exit; CODE is this file as the launcher read it
when it loaded pidns.py. A fork of the stage would keep, for the whole session, the pages it shares
with the launcher, and a private copy of each the launcher writes later; this holds a bare
interpreter's. So this file imports built-in modules only, and nothing of the project.

The forwarded signals arrive blocked (fork_init blocks them before it forks pid 2): what the
launcher sent meanwhile is pending, and passed on once the handlers are in place. Init joins the
session's cgroup itself, after its interpreter has started, so that start-up is charged to the
launcher's cgroup rather than to the agent's limits, and says on JOINED_FD whether it did (pid 2
checks before the agent may start). Then it reaps every process of the namespace until the agent
ends, and writes the agent's wait status on STATUS_FD; when init exits, the kernel kills whatever
is left in the namespace. Its parent-death signal, set before the exec, is kept across it.
"""

import os
import sys

TYPE_CHECKING = False  # typing is not loaded either
if TYPE_CHECKING:
    import signal
else:  # the built-in module under `signal`, which builds enums of its constants: most of what this
    import _signal as signal  # process would otherwise hold in memory for the session's life

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # pidns.FORWARDED
JOINED = b"J"
STATUS_SIZE = 4  # pidns._STATUS: a native int


def join(files: list[str]) -> bytes:
    """Move this process into the session's cgroup (each hierarchy's file); JOINED, or why not."""
    try:
        for path in files:
            with open(path, "w") as f:
                f.write("0")
    except OSError as exc:
        return f"the session's init could not join its cgroup: {exc}".encode(errors="replace")[:512]
    return JOINED


def main(agent: int, status_fd: int, joined_fd: int, join_files: list[str]) -> None:
    def forward(signum: int, _frame: object) -> None:
        try:  # noqa: SIM105 - contextlib is not loaded in a bare interpreter: kept that way
            os.kill(agent, signum)
        except ProcessLookupError:
            pass

    code = 1
    try:
        for sig in FORWARDED:
            signal.signal(sig, forward)
        answer = join(join_files)
        try:  # noqa: SIM105 - as above
            os.write(joined_fd, answer)
        except OSError:
            pass  # pid 2 is gone: there is no agent to wait for, os.wait() says so
        os.close(joined_fd)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        while True:
            pid, status = os.wait()  # orphans are reparented here: reap them too
            if pid == agent:
                os.write(status_fd, status.to_bytes(STATUS_SIZE, sys.byteorder, signed=True))
                code = 0
                break
    finally:
        os._exit(code)  # the kernel then kills whatever is left in the namespace


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
