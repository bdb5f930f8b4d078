"""adl-exec started with its stdin, stdout or stderr closed. It hands its descriptors 0-2 to the
agent; a descriptor it opened itself must never take one of those numbers and reach the agent.
Embedded, the first one it opens is its end of the guardian's socket: the guardian runs as root
outside the sandbox and, once the launcher is gone, kills the members of the cgroup directories in
the last frame it read and writes to the kill files that frame names. Through the daemon, it is
the client's connection to the daemon, or the session file."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.launch_socket import ScriptedDaemon
from ..helpers.sandbox import AGENT_USER, Sandbox, needs_root

# The agent looks at its descriptors 0-2 and, on each that is a socket, writes the guardian a frame:
# the directory in ALLOWED_GROUP (its cgroup.procs lists a process of the test's) and a "kill file",
# ALLOWED_TARGET, a file only root can write, outside everything the policy grants.
WRITE_FRAMES = """
import os, stat, struct
body = b"d" + os.environ["ALLOWED_GROUP"].encode() + b"\\0k" + os.environ["ALLOWED_TARGET"].encode()
seen = []
for fd in (0, 1, 2):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        seen.append(f"{fd} closed")
        continue
    seen.append(f"{fd} {'socket' if stat.S_ISSOCK(mode) else 'other'}")
    if stat.S_ISSOCK(mode):
        try:
            os.write(fd, struct.pack("!I", len(body)) + body)
        except OSError:
            pass
with open(os.environ["ALLOWED_REPORT"], "w") as out:
    out.write(", ".join(seen))
"""


def close_then_exec(fds: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


@needs_root
@pytest.mark.parametrize("closed", [(0,), (1,), (0, 1, 2)], ids=["stdin", "stdout", "all"])
def test_an_agent_never_gets_the_guardians_socket_as_its_stdio(sandbox: Sandbox, closed: tuple[int, ...]) -> None:
    target = sandbox.outside / "root-only.txt"
    target.write_text("intact\n")
    target.chmod(0o600)
    group = sandbox.outside / "not-a-cgroup"
    group.mkdir()
    bystander = subprocess.Popen(["sleep", "60"])
    (group / "cgroup.procs").write_text(f"{bystander.pid}\n")
    report = sandbox.ws / "descriptors.txt"
    environ = sandbox.environ(
        {
            "ADL_ENFORCER_CACHE_DIR": "off",
            "ALLOWED_GROUP": str(group),
            "ALLOWED_TARGET": str(target),
            "ALLOWED_REPORT": str(report),
        }
    )
    argv = [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(sandbox.policy()), "--user", AGENT_USER]
    try:
        proc = subprocess.run(
            [*argv, "--", "python3", "-c", WRITE_FRAMES],
            env=environ,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            preexec_fn=close_then_exec(closed),  # after subprocess set up 0-2: closed in adl-exec
        )
        assert proc.returncode == 0, proc.stderr
        # Root wrote nothing the agent named and killed nothing; /dev/null stood in for the closed ones.
        outcome = (target.read_text(), bystander.poll(), report.read_text())
        assert outcome == ("intact\n", None, "0 other, 1 other, 2 other")
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("session_file", [False, True], ids=["plain", "session-file"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "argparse"])
def test_the_daemon_gets_no_descriptor_of_the_clients_own_as_stdio(
    tmp_path: Path, fast: bool, session_file: bool
) -> None:
    """The client's connection (or its session file) as the agent's stdin would let the agent read
    the daemon's answers to the client and keep the connection open after the client is gone."""
    daemon = ScriptedDaemon(tmp_path, [pb.LaunchReply(accepted=False, refusal="noted").SerializeToString()])
    options = ["--session-file", str(tmp_path / "session.json")] if session_file else []
    if not fast:
        options.append("--rep")  # an abbreviation: the fast reader declines it, argparse reads it
    argv = [sys.executable, "-m", "enforcer.cli.exec", "--daemon", f"unix:{daemon.path}", "--agent", "A", *options]
    try:
        proc = subprocess.run(
            [*argv, "--", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=close_then_exec((0,)),
            env={k: v for k, v in os.environ.items() if k != "ADL_ENFORCER_ADDR"},
        )
    finally:
        daemon.close()
    assert proc.returncode == 125 and "refused: noted" in proc.stderr, proc.stderr
    null = os.stat(os.devnull)
    assert len(daemon.received) == 3
    stdin = daemon.received[0]
    assert not stat.S_ISSOCK(stdin.st_mode) and not stat.S_ISREG(stdin.st_mode)
    assert (stdin.st_dev, stdin.st_ino) == (null.st_dev, null.st_ino)


def test_the_agents_frame_is_one_the_guardian_reads() -> None:
    """The agent's frame above is one the guardian decodes (the attack is not void by its form)."""
    from enforcer.sandbox import guardian

    body = b"d/a/group\0k/a/kill"
    assert guardian.decode_last(struct.pack("!I", len(body)) + body) == (["/a/group"], ["/a/kill"])


def test_only_closed_standard_descriptors_are_filled() -> None:
    """stdin closed, stdout a pipe, stderr closed: 0 and 2 become /dev/null, 1 stays the pipe, and
    nothing else is left open."""
    probe = (
        "import os\n"
        "from enforcer.command_start import open_standard_streams\n"
        "open_standard_streams()\n"
        "print([os.readlink(f'/proc/self/fd/{fd}') for fd in (0, 2)], sorted(os.listdir('/proc/self/fd'))[:4])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=30,
        preexec_fn=close_then_exec((0, 2)),
    )
    # listdir's own descriptor is the fourth: 0-2 and nothing else were open before it
    assert proc.stdout.strip() == "['/dev/null', '/dev/null'] ['0', '1', '2', '3']"
