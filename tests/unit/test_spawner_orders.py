"""The launch order and the spawner configuration (daemon/orders.py): typed, and refused whole
when a field is missing, unknown or of the wrong type."""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from enforcer.daemon.orders import (
    LaunchOrder,
    OrderError,
    SessionGone,
    SessionStarted,
    SpawnerConfig,
    TerminateOrder,
    read_event,
    read_order,
    session_named,
)
from enforcer.egress_values import EgressValues
from enforcer.policy.errors import Refusal

from ..helpers.documents import base_adl


def order(**changes: Any) -> LaunchOrder:
    members: dict[str, Any] = {
        "session": "s-0123",
        "agent": "coder",
        "adl": {"adl_spec": "0.3.0", "name": "Coder"},
        "aaif": None,
        "policy_digest": "sha256:ab",
        "argv": ("python3", "agent.py"),
        "environ": {"PATH": "/usr/bin"},
        "cwd": "/home/a",
        "uid": 1000,
        "gid": 1000,
        "accept_unenforced": ("network",),
        "pids_max": 512,
    }
    members.update(changes)
    return LaunchOrder(**members)


def members_of(data: bytes) -> dict[str, Any]:
    return json.loads(data)["launch"]


def test_a_launch_order_crosses_the_socket_unchanged() -> None:
    sent = order(aaif={"aaif": "1"})
    received = read_order(sent.to_json())
    assert received == sent and isinstance(received, LaunchOrder)
    assert received.argv == ("python3", "agent.py")  # JSON lists come back as tuples


def test_a_terminate_order_crosses_the_socket_unchanged() -> None:
    assert read_order(TerminateOrder("s-0123").to_json()) == TerminateOrder("s-0123")


@pytest.mark.parametrize("missing", ["policy_digest", "uid", "cwd", "argv"])
def test_a_missing_member_refuses_the_order(missing: str) -> None:
    members = members_of(order().to_json())
    del members[missing]
    with pytest.raises(OrderError, match=f"missing {missing}"):
        read_order(json.dumps({"launch": members}).encode())


def test_an_unknown_member_refuses_the_order() -> None:
    members = members_of(order().to_json())
    members["run_as_root"] = True
    with pytest.raises(OrderError, match="unknown run_as_root"):
        read_order(json.dumps({"launch": members}).encode())


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("uid", True),  # a bool is not a uid
        ("uid", -1),
        ("gid", "1000"),
        ("pids_max", 0),
        ("argv", []),
        ("argv", ["python3", 7]),
        ("argv", ["python3", "a\0b"]),
        ("environ", {"PATH": 1}),
        ("environ", ["PATH=/bin"]),
        ("cwd", "relative/dir"),
        ("adl", ["not", "an", "object"]),
        ("aaif", "document"),
        ("session", ""),
        ("policy_digest", None),
        ("accept_unenforced", "network"),
    ],
)
def test_a_member_of_the_wrong_type_refuses_the_order(member: str, value: Any) -> None:
    members = members_of(order().to_json())
    members[member] = value
    with pytest.raises(OrderError, match=member):
        read_order(json.dumps({"launch": members}).encode())
    with pytest.raises(OrderError, match=member):  # built in the daemon: refused there too
        order(**{member: value})


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"launch": {}, "terminate": {"session": "s"}}',
        b'{"exec": {"session": "s"}}',
        b'{"launch": ["s"]}',
        b'{"terminate": {"session": "s", "signal": 9}}',
        b'{"terminate": {}}',
    ],
)
def test_what_is_not_an_order_is_refused(data: bytes) -> None:
    with pytest.raises(OrderError):
        read_order(data)


def test_the_session_of_a_refused_order() -> None:
    members = members_of(order().to_json())
    members["uid"] = "root"
    assert session_named(json.dumps({"launch": members}).encode()) == "s-0123"
    assert session_named(b'{"terminate": {"session": "s-9"}}') == "s-9"
    for data in (b"not json", b'{"launch": {"session": 5}}', b'{"launch": []}', b"{}"):
        assert session_named(data) is None


def config(**changes: Any) -> SpawnerConfig:
    members: dict[str, Any] = {
        "audit_dir": Path("/var/lib/adl-enforcer/audit"),
        "audit_key": Path("/etc/adl-enforcer/audit.key"),
        "audit_group_ms": 5.0,
        "audit_group_records": 64,
        "production": False,
        "regions": Path("/etc/regions.yaml"),
        "baseline": Path("/etc/baseline.yaml"),
        "cgroup_group": "adl-enforcer",
        "helper_memory_mb": 256,
        "egress": EgressValues(max_connections=8),
    }
    members.update(changes)
    return SpawnerConfig(**members)


def test_the_spawner_configuration_is_checked_when_made() -> None:
    made = config()
    assert made.egress.max_connections == 8
    with pytest.raises(AttributeError):
        made.cgroup_group = "other"  # type: ignore[misc]
    for member, value in [
        ("audit_dir", "/var/lib/adl-enforcer/audit"),  # a str where a Path belongs
        ("audit_group_records", 6.4),
        ("production", "yes"),
        ("helper_memory_mb", 0),
        ("cgroup_group", ""),
        ("egress", {"max_connections": 8}),
    ]:
        with pytest.raises(OrderError, match=member):
            config(**{member: value})


def test_an_order_is_frozen() -> None:
    made = order()
    with pytest.raises(AttributeError):
        made.uid = 0  # type: ignore[misc]
    assert replace(made, pids_max=64).pids_max == 64
    with pytest.raises(OrderError):
        replace(made, uid=-5)


SPAWNER_SCRIPT = """
import json, os, socket, sys, uuid
from pathlib import Path
from enforcer.daemon import spawner
from enforcer.daemon.orders import SpawnerConfig
from enforcer.egress_values import EgressValues
from enforcer.framing import recv_frame, send_frame

tmp = Path(sys.argv[1])
config = SpawnerConfig(
    audit_dir=tmp / "audit", audit_key=tmp / "key.pem", audit_group_ms=5.0, audit_group_records=64,
    production=False, regions=tmp / "regions.yaml", baseline=tmp / "baseline.yaml",
    cgroup_group=f"adl-test-orders-{uuid.uuid4().hex[:8]}", helper_memory_mb=64,
    egress=EgressValues(),
)
handle = spawner.start(config)
members = json.loads(sys.argv[2])
ours, client = socket.socketpair()
pipes = [os.pipe() for _ in range(3)]
send_frame(handle.sock, json.dumps(members).encode(), [pipes[0][0], pipes[1][1], pipes[2][1], client.fileno()])
client.close()
ended = recv_frame(ours)
event = recv_frame(handle.sock)
handle.sock.close()
os.waitpid(handle.pid, 0)
from enforcer.v1 import enforcer_pb2 as pb
message = pb.SessionEnded.FromString(ended[0]) if ended else None
print(json.dumps({
    "caller": None if message is None else [message.session, message.reason, message.exit_code, message.detail],
    "daemon": json.loads(event[0]) if event else None,
}))
"""


def test_the_spawner_refuses_a_mistyped_order_and_launches_nothing(tmp_path: Path) -> None:
    """A real spawner (in a process of its own, as the daemon forks it): the caller hears the
    refusal on its launch connection, the daemon that the session ended; no supervisor is forked."""
    import subprocess
    import sys

    members = members_of(order(session="s-mistyped").to_json())
    members["uid"] = "0"
    result = subprocess.run(
        [sys.executable, "-c", SPAWNER_SCRIPT, str(tmp_path), json.dumps({"launch": members})],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)
    session, reason, exit_code, detail = reported["caller"]
    assert (session, reason, exit_code) == ("s-mistyped", "refused", 125)
    assert "launch order refused" in detail and "uid" in detail
    assert reported["daemon"] == {"ended": {"session": "s-mistyped", "status": 125}}
    assert "order refused" in result.stderr


def test_the_spawner_compiles_an_orders_documents_before_it_forks_the_supervisor(schemas: Any) -> None:
    """What the spawner compiles ahead, the supervisor (its fork) finds compiled; documents that
    do not compile are left to the supervisor, which refuses the session with the reason."""
    from enforcer import launching
    from enforcer.daemon import spawner

    repo = Path(__file__).resolve().parents[2]
    settings = config(
        regions=repo / "policies" / "regions.yaml",
        baseline=repo / "policies" / "runtime-baseline.yaml",
        spec_dir=schemas.root,
    )
    adl = {**base_adl(id="did:web:agents.example:ahead"), "description": f"compiled ahead {uuid.uuid4()}"}
    launch = order(adl=adl)
    before = set(launching._COMPILED)
    assert spawner._compile_ahead(launch, settings), "compiled: the supervisors prepared before are retired"
    (key,) = set(launching._COMPILED) - before
    compiled = spawner.policy_documents(launch, settings).load()
    assert compiled is launching._COMPILED[key].compiled
    assert compiled.policy.agent_id == "did:web:agents.example:ahead"
    assert not spawner._compile_ahead(launch, settings), "compiled before: nothing to retire"
    assert spawner._compile_ahead(order(adl={**adl, "description": f"another {uuid.uuid4()}"}), settings)

    rejected = order(adl={"adl_spec": "0.3.0", "name": "Coder"})  # required members missing
    before = set(launching._COMPILED)
    assert not spawner._compile_ahead(rejected, settings)  # the spawner goes on
    assert set(launching._COMPILED) == before
    with pytest.raises(Refusal):
        spawner.policy_documents(rejected, settings).load()


def test_spawner_events_read_back_as_sent() -> None:
    for event in (SessionStarted("s-1", 4242), SessionGone("s-1", -9), SessionGone("s-2", 125)):
        assert read_event(event.to_json()) == event


@pytest.mark.parametrize(
    "frame",
    [
        b"not json",
        b"[]",
        b'{"started": {"session": "s", "pid": 1}, "ended": {"session": "s", "status": 0}}',
        b'{"event": "started", "session": "s", "pid": 1}',
        b'{"started": {"session": "s"}}',
        b'{"started": {"session": "s", "pid": 1, "uid": 0}}',
        b'{"started": {"session": "s", "pid": "1"}}',
        b'{"started": {"session": "s", "pid": 0}}',
        b'{"started": {"session": "", "pid": 1}}',
        b'{"ended": {"session": "s", "status": true}}',
        b'{"ended": {"session": 7, "status": 0}}',
    ],
)
def test_a_spawner_event_that_is_not_one_is_refused(frame: bytes) -> None:
    with pytest.raises(OrderError):
        read_event(frame)


# What the scripts below share: a real spawner in a process of its own (as the daemon forks it),
# orders sent with a caller's stdio and launch connection, and the spawner's reports until the
# session is gone. argv: the temporary directory, the order's members (JSON), the cgroup group.
SPAWNER_PRELUDE = """
import errno, json, os, resource, socket, sys
from pathlib import Path
from enforcer.daemon import spawner
from enforcer.daemon.orders import SpawnerConfig, read_event
from enforcer.egress_values import EgressValues
from enforcer.framing import recv_frame, send_frame

tmp, members, group = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]


def start():
    handle = spawner.start(SpawnerConfig(
        audit_dir=tmp / "audit", audit_key=tmp / "key.pem", audit_group_ms=5.0, audit_group_records=64,
        production=False, regions=tmp / "regions.yaml", baseline=tmp / "baseline.yaml",
        cgroup_group=group, helper_memory_mb=64, egress=EgressValues(),
    ))
    handle.sock.settimeout(30)
    return handle


def send_order(handle, members):
    \"\"\"Whether the caller heard the session's end, and the spawner's reports up to it.\"\"\"
    ours, client = socket.socketpair()
    ours.settimeout(30)
    pipes = [os.pipe() for _ in range(3)]
    send_frame(handle.sock, json.dumps(members).encode(), [pipes[0][0], pipes[1][1], pipes[2][1], client.fileno()])
    client.close()
    ended = recv_frame(ours)
    events = []
    while True:
        frame = recv_frame(handle.sock)
        if frame is None:
            events.append("end of stream")
            break
        events.append(type(read_event(frame[0])).__name__)
        if events[-1] == "SessionGone":
            break
    return {"caller_heard": ended is not None, "daemon": events}


def stop(handle):
    handle.sock.close()
    os.waitpid(handle.pid, 0)
"""

MANY_DESCRIPTORS_SCRIPT = (
    SPAWNER_PRELUDE
    + """
_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
# As if a thousand sessions ran: the supervisors' pidfds are numbered above 1024.
# F_DUPFD, not dup2: every process forked from here inherits this, and the stage opens two pidfds
# in a row (the second took the first's number back and dup2 then closed the first one's copy).
import fcntl
opened = os.pidfd_open
def numbered_high(pid, flags=0):
    fd = opened(pid, flags)
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1500)
    os.close(fd)
    return high
os.pidfd_open = numbered_high
handle = start()
report = send_order(handle, members)
stop(handle)
print(json.dumps(report))
"""
)


def run_spawner_script(script: str, tmp_path: Path, members: dict[str, Any], group: str) -> Any:
    """Run `script` (SPAWNER_PRELUDE and more) for one order; remove the group's cgroups after it,
    whatever happened. Returns the completed process and what is left in each group."""
    import subprocess
    import sys

    from enforcer.daemon import spawner
    from enforcer.sandbox import cgroups

    names = (group, group + spawner.HELPERS_SUFFIX)
    try:
        result = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path), json.dumps({"launch": members}), group],
            capture_output=True,
            text=True,
            timeout=90,
        )
        left = {name: sorted(cgroups.existing(group=name)) for name in names}
    finally:
        for name in names:
            for leftover in cgroups.existing(group=name).values():
                leftover.remove(timeout=5)
            for base in cgroups.group_directories(group=name):
                if base.is_dir():
                    base.rmdir()
    return result, left


def test_the_spawner_outlives_a_supervisor_whose_descriptor_is_numbered_above_1024(tmp_path: Path) -> None:
    """The spawner waits on one pidfd per supervisor: with many sessions (or descriptors) their
    numbers pass 1024, which select() cannot wait on; the spawner (and with it every session)
    must not die of it, and must still report the supervisor's end."""
    group = f"adl-test-fds-{uuid.uuid4().hex[:8]}"
    members = members_of(order(session="s-many-fds").to_json())
    result, _ = run_spawner_script(MANY_DESCRIPTORS_SCRIPT, tmp_path, members, group)
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)
    assert reported == {"caller_heard": True, "daemon": ["SessionStarted", "SessionGone"]}, result.stderr[-2000:]


FORK_FAILS_SCRIPT = (
    SPAWNER_PRELUDE
    + """
# The spawner's own fork, its guardian's, then the first supervisor's: that one fails as under
# a full pids limit (EAGAIN).
forks = [0]
real_fork = os.fork
def fork():
    forks[0] += 1
    if forks[0] == 3:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    return real_fork()
os.fork = fork
handle = start()
report = {}
for attempt in ("first", "second"):
    members["launch"]["session"] = "s-" + attempt
    report[attempt] = send_order(handle, members)
    if report[attempt]["daemon"][-1] == "end of stream":
        break
stop(handle)
print(json.dumps(report))
"""
)


def test_a_supervisor_that_cannot_be_forked_refuses_its_session_and_the_spawner_serves_on(tmp_path: Path) -> None:
    """A fork that fails (EAGAIN under a full pids limit, which sessions' processes count toward)
    must refuse that session only: the spawner ending would take every running session with it."""
    from enforcer.daemon import spawner

    group = f"adl-test-fork-{uuid.uuid4().hex[:8]}"
    members = members_of(order(session="s-first").to_json())
    result, left = run_spawner_script(FORK_FAILS_SCRIPT, tmp_path, members, group)
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)
    assert reported["first"] == {"caller_heard": True, "daemon": ["SessionGone"]}, result.stderr[-2000:]
    assert reported["second"] == {"caller_heard": True, "daemon": ["SessionStarted", "SessionGone"]}
    assert left == {group: [], group + spawner.HELPERS_SUFFIX: []}


def test_a_cgroup_that_cannot_be_removed_is_retried_and_reported_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spawner retries a session's cgroup every turn until it goes; an error other than EBUSY
    is said once, not every 20 ms for as long as it lasts."""
    from enforcer.daemon import spawner

    class Group:
        def __init__(self) -> None:
            self.directories = [tmp_path / "session-x"]

        def members(self) -> list[int]:
            return []

        def kill_all(self) -> None:
            pass

    directory = tmp_path / "session-x"
    directory.mkdir()
    (directory / "stuck").touch()  # rmdir: ENOTEMPTY, as an error other than EBUSY
    sessions = spawner._Sessions(guardian=None, left=[Group()])
    for _ in range(5):
        sessions.remove_left()
    said = capsys.readouterr().err.splitlines()
    assert len(sessions.left) == 1 and len(said) == 1 and "session-x" in said[0], said
    (directory / "stuck").unlink()
    sessions.remove_left()
    assert sessions.left == [] and sessions.reported == set() and not directory.exists()


def test_compiling_ahead_is_not_fooled_by_an_id_reused_after_collection(schemas: Any) -> None:
    """A policy launching forgot (evicted, or past its time boundary) and collected may leave its
    id to the next one compiled: that one is compiled all the same, and must be told so (the
    supervisors prepared before it would otherwise compile it again, each of them)."""
    import gc

    from enforcer import launching
    from enforcer.daemon import spawner

    repo = Path(__file__).resolve().parents[2]
    settings = config(
        regions=repo / "policies" / "regions.yaml",
        baseline=repo / "policies" / "runtime-baseline.yaml",
        spec_dir=schemas.root,
    )
    launch = order(adl={**base_adl(id="did:web:agents.example:reused"), "description": f"reused {uuid.uuid4()}"})
    reused = 0  # how often the allocator gave the new policy the old one's id (not up to the test)
    for _ in range(5):
        before = set(launching._COMPILED)
        assert spawner._compile_ahead(launch, settings)
        (key,) = set(launching._COMPILED) - before
        first = id(launching._COMPILED[key].compiled)
        assert not spawner._compile_ahead(launch, settings)
        del launching._COMPILED[key]  # forgotten, as the oldest of COMPILED_ENTRIES is
        gc.collect()
        # Nothing is kept under its id: whatever the allocator gives that id to next is new.
        assert first not in spawner._LOADED
        assert spawner._compile_ahead(launch, settings), "compiled again: not the policy remembered before"
        reused += id(launching._COMPILED[key].compiled) == first
        del launching._COMPILED[key]
        gc.collect()
    print(f"ids reused by the policy compiled again: {reused} of 5")


def test_a_report_that_fails_to_be_handled_does_not_stop_the_later_ones(caplog: pytest.LogCaptureFixture) -> None:
    """One report whose handling raises (a bug) must not end the thread that frees every later
    session's slot: the daemon would refuse that caller, then everyone, at the session bounds."""
    from types import SimpleNamespace

    from enforcer.daemon.daemon import Daemon

    ended: list[str] = []

    class Registry:
        def set_pid(self, session: str, pid: int) -> None:
            if session == "bad":
                raise RuntimeError("a bug")

        def end(self, session: str) -> object:
            ended.append(session)
            return session

    class Launch:
        def session_ended(self, record: object, status: int) -> None:
            if record == "s1":
                raise KeyError("another bug")

    events = [SessionStarted("bad", 10), SessionGone("s1", 0), SessionGone("s2", 0)]
    stopping = threading.Event()
    stopping.set()
    fake = SimpleNamespace(
        spawner=SimpleNamespace(events=lambda: iter(events)),
        registry=Registry(),
        _launch=Launch(),
        _stop_wanted=stopping,
    )
    with caplog.at_level("ERROR"):
        Daemon._spawner_events(fake)  # type: ignore[arg-type]
    assert ended == ["s1", "s2"]
    assert sum("could not be handled" in r.getMessage() for r in caplog.records) == 2
