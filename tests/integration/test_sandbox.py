"""adl-exec against the real kernel: each allowed operation works, each forbidden one fails, per
domain; typed outcomes; refusals; the audit trail; nothing left behind."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..helpers.processes import alive
from ..helpers.sandbox import AGENT_USER, Sandbox, give_to_agent, needs_root, session_cgroups

pytestmark = needs_root


def test_filesystem_reads_and_writes(sandbox: Sandbox) -> None:
    r = sandbox.run("cat", str(sandbox.ws / "notes.txt"), str(sandbox.ref / "doc.txt"))
    assert r.code == 0 and r.out == "workspace notes\nreference doc\n"
    r = sandbox.run("cat", str(sandbox.outside / "private.txt"))
    assert r.code == 1 and "Permission denied" in r.err and "OUTSIDE" not in r.out
    code = (
        f"open({str(sandbox.ws / 'new.txt')!r}, 'w').write('made')\n"
        f"import os\n"
        f"for target in [{str(sandbox.ref / 'x.txt')!r}, {str(sandbox.outside / 'x.txt')!r}, '/tmp/escape.txt']:\n"
        f"    try:\n"
        f"        open(target, 'w'); print('WROTE', target)\n"
        f"    except PermissionError:\n"
        f"        print('denied', target)\n"
    )
    r = sandbox.python(code)
    assert r.code == 0 and "WROTE" not in r.out and r.out.count("denied") == 3, r.out + r.err
    assert (sandbox.ws / "new.txt").read_text() == "made"
    assert not Path("/tmp/escape.txt").exists()


def test_denied_paths_are_masked(sandbox: Sandbox) -> None:
    for name in ("secret.txt", "key.pem"):
        r = sandbox.run("cat", str(sandbox.ws / name))
        assert r.code != 0 and "CONTENT" not in r.out
    launch = sandbox.run("ls", str(sandbox.ws)).record("launch")
    masks = next(layer for layer in launch["payload"]["layers"] if layer["name"] == "denied_paths")
    assert any("secret.txt" in d for d in masks["details"]) and any("key.pem" in d for d in masks["details"])


def test_allowed_creation_works_through_the_creation_guard(sandbox: Sandbox) -> None:
    """With denied patterns and a writable grant every creating call goes through the guard; the
    ones the policy allows must behave exactly as without it."""
    ws = str(sandbox.ws)
    out = sandbox.ws / "stdout.txt"  # /dev/stdout reopens it: the agent's own file, not a pipe of root's
    out.touch()
    give_to_agent(out)
    r = sandbox.python(
        f"""
import fcntl, os, stat
ws = {ws!r}
os.umask(0o027)
open(ws + "/new.txt", "w").write("hello")
print("mode", oct(stat.S_IMODE(os.stat(ws + "/new.txt").st_mode)))
fd = os.open(ws + "/cloexec.txt", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
print("cloexec", bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC))
os.write(fd, b"x"); os.close(fd)
os.makedirs(ws + "/a/b/c")
os.chdir(ws + "/a/b")
open("rel.txt", "w").write("r")
os.rename(ws + "/new.txt", ws + "/renamed.txt")
os.link(ws + "/renamed.txt", ws + "/hard.txt")
os.symlink("renamed.txt", ws + "/soft.txt")
open("/dev/null", "w").write("discarded")
with open("/dev/stdout", "w") as out:
    out.write("via-dev-stdout\\n")
try:
    open("/proc/self/environ", "w")
except OSError as exc:
    print("proc", exc.errno)
try:
    open(ws + "/" + "n" * 5000, "w")
except OSError as exc:
    print("long", exc.errno)
print("done", open(ws + "/soft.txt").read(), open(ws + "/a/b/rel.txt").read())
""",
        stdout=out,
    )
    assert r.code == 0, r.err
    assert "mode 0o640" in r.out and "cloexec True" in r.out and "via-dev-stdout" in r.out, r.out
    assert "long 36" in r.out  # ENAMETOOLONG, as without the guard
    assert "proc 13" in r.out and "done hello r" in r.out, r.out
    assert (sandbox.ws / "hard.txt").read_text() == "hello"
    assert r.record("exit")["payload"]["creations_refused"] == 0


def test_exec_allowed_and_denied(sandbox: Sandbox) -> None:
    r = sandbox.python(
        f"import subprocess; print(subprocess.run(['ls', {str(sandbox.ref)!r}], capture_output=True, text=True).stdout)"
    )
    assert r.code == 0 and "doc.txt" in r.out
    r = sandbox.python("import os; os.execv('/usr/bin/id', ['id'])")
    assert r.code == 1 and "PermissionError" in r.err
    r = sandbox.run("id")
    assert (
        r.code == 125
        and "not allowed" in r.err
        and r.kinds() == ["writer.open", "refused", "writer.close", "checkpoint"]
    )


def test_environment_is_scrubbed_and_names_audited(sandbox: Sandbox) -> None:
    env = {"ALLOWED_ONE": "one", "ALLOWED_SECRET": "hidden-value-1", "OTHER_TOKEN": "hidden-value-2"}
    r = sandbox.python("import os, json; print(json.dumps(sorted(os.environ)))", env=env)
    names = json.loads(r.out)
    assert "ALLOWED_ONE" in names and "ALLOWED_SECRET" not in names and "OTHER_TOKEN" not in names
    launch = r.record("launch")["payload"]
    assert {"ALLOWED_SECRET", "OTHER_TOKEN"} <= set(launch["env_dropped"])
    blob = (sandbox.audit).joinpath(sorted(os.listdir(sandbox.audit))[0]).read_text()
    assert "hidden-value" not in blob


def test_network_namespace_is_empty(sandbox: Sandbox) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        r = sandbox.python(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)")
    assert r.code == 1 and "PermissionError" in r.err  # Landlock handles TCP connect with no port allowed
    r = sandbox.python("import os; print(open(f'/proc/{os.getpid()}/net/dev').read())")
    interfaces = [line.split(":")[0].strip() for line in r.out.splitlines()[2:] if ":" in line]
    assert r.code == 0 and interfaces == ["lo"], r.out + r.err  # a fresh network namespace


def test_typed_outcomes(sandbox: Sandbox) -> None:
    r = sandbox.python("raise SystemExit(7)")
    assert r.code == 7 and "ended: exit (exit code 7" in r.err
    r = sandbox.python("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert r.code == 128 + signal.SIGTERM and "ended: signal" in r.err
    assert r.record("exit")["payload"]["reason"] == "signal"


def test_oom_is_typed(sandbox: Sandbox) -> None:
    r = sandbox.python("x = bytearray(400 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])")
    assert r.code == 128 + signal.SIGKILL and r.record("exit")["payload"]["reason"] == "oom", r.err


def test_evidence_record_is_written(sandbox: Sandbox, spec: Path) -> None:
    import jsonschema

    r = sandbox.run("ls", str(sandbox.ws))
    evidence = r.record("session.evidence")["payload"]["evidence"]
    schema = json.loads(
        (spec / "agent-definition-language__specification/core/0.3.0/schema-enforcement-record.json").read_text()
    )
    jsonschema.Draft202012Validator(schema).validate(evidence)
    assert evidence["outcome"] == "completed" and evidence["tier"] == "R3"


def test_refusals(sandbox: Sandbox) -> None:
    retired = sandbox.policy(lifecycle={"status": "retired"})
    r = sandbox.run("ls", policy=retired)
    assert r.code == 125 and "retired" in r.err and "refused" in r.kinds()


def test_explain_runs_nothing(sandbox: Sandbox) -> None:
    marker = sandbox.ws / "ran"
    r = sandbox.run("python3", "-c", f"open({str(marker)!r}, 'w')", args=("--explain",))
    assert r.code == 0 and not marker.exists() and r.records == []
    assert "filesystem    active" in r.out and "creation guard" in r.out


def test_explain_shows_the_network_layer_active_with_its_rules(sandbox: Sandbox) -> None:
    net = sandbox.policy(permissions={"network": {"allowed_hosts": ["api.example.com"], "allowed_ports": [443]}})
    r = sandbox.run("ls", policy=net, args=("--explain",), env={"ADL_ENFORCER_UPSTREAM_DNS": "192.0.2.53:5353"})
    assert r.code == 0 and r.records == []
    assert "network       active" in r.out and "egress host filter" in r.out
    assert "hosts: api.example.com" in r.out and "ports: 443" in r.out and "192.0.2.53:5353" in r.out
    assert "no TCP listening; every TCP connect goes to the filter" in r.out


def test_sigkill_of_adl_exec_leaves_nothing(sandbox: Sandbox) -> None:
    # The grandchild holds a lock on a workspace file: it is free again only once the grandchild is
    # gone (its pid inside the session's PID namespace means nothing out here).
    lock = sandbox.ws / "grandchild.lock"
    code = (
        "import fcntl, os, time\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        f"        f = open({str(lock)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX); f.write('held'); f.flush()\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    environ = {
        **os.environ,
        "ADL_ENFORCER_AUDIT_DIR": str(sandbox.audit),
        "ADL_ENFORCER_AUDIT_KEY": str(sandbox.root / "k.pem"),
        "ADL_ENFORCER_CGROUP_GROUP": sandbox.group,
    }
    proc = subprocess.Popen([*_adl_exec(sandbox), "--", "python3", "-c", code], env=environ)
    try:
        deadline = time.monotonic() + 20
        while not lock.exists() or not lock.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.05)
        assert session_cgroups(sandbox.group) and _locked(lock)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (session_cgroups(sandbox.group) or _locked(lock)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _locked(lock) and session_cgroups(sandbox.group) == []
    finally:
        proc.kill()


def _locked(path: Path) -> bool:
    with path.open() as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _adl_exec(sandbox: Sandbox) -> list[str]:
    return [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(sandbox.policy()), "--user", AGENT_USER]


def test_the_agent_holds_only_its_stdio(sandbox: Sandbox) -> None:
    # The stage receives descriptors (stdio, the guard's report pipe) and held the launcher's; none
    # but 0-2 may reach the agent. 3 is the directory listdir itself opens.
    r = sandbox.python("import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))")
    assert r.code == 0 and r.out.strip() == "[0, 1, 2, 3]", (r.out, r.err)


def test_sigkill_of_adl_exec_before_the_launch_leaves_nothing(sandbox: Sandbox) -> None:
    """adl-exec creates the session's cgroup and forks its stage before loading the policy code;
    killed then, its guardian still removes both."""
    environ = {
        **os.environ,
        "ADL_ENFORCER_AUDIT_DIR": str(sandbox.audit),
        "ADL_ENFORCER_AUDIT_KEY": str(sandbox.root / "k.pem"),
        "ADL_ENFORCER_CGROUP_GROUP": sandbox.group,
    }
    proc = subprocess.Popen([*_adl_exec(sandbox), "--", "ls"], env=environ)
    try:
        deadline = time.monotonic() + 20
        while not session_cgroups(sandbox.group) or len(_children(proc.pid)) < 2:  # the guardian and the stage
            assert proc.poll() is None and time.monotonic() < deadline, "no session cgroup and stage appeared"
            time.sleep(0.005)
        stages = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (session_cgroups(sandbox.group) or any(alive(p) for p in stages)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in stages) and session_cgroups(sandbox.group) == []
    finally:
        proc.kill()


def test_a_failing_sandbox_step_is_reported_and_nothing_runs(sandbox: Sandbox) -> None:
    from enforcer.documents import load_policy
    from enforcer.sandbox import launcher
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.sandbox.stage import new_session_id
    from enforcer.session import host_features

    marker = sandbox.ws / "ran"
    plan = build_plan(
        load_policy(sandbox.policy()),
        ["python3", "-c", f"open({str(marker)!r}, 'w')"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=host_features(),
    )
    plan.file_masks.append(str(sandbox.root / "no-such-file"))  # masking it fails in the stage
    try:
        launcher.run(plan, new_session_id())
    except launcher.LaunchError as exc:
        assert "sandbox setup failed in the child: mounts:" in str(exc) and "no-such-file" in str(exc)
    else:
        raise AssertionError("the launch did not fail")
    assert not marker.exists()


def _marker_plan(sandbox: Sandbox, marker: Path) -> Any:
    from enforcer.documents import load_policy
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.session import host_features

    return build_plan(
        load_policy(sandbox.policy()),
        ["python3", "-c", f"open({str(marker)!r}, 'w')"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=host_features(),
    )


def test_the_agent_starts_only_once_what_must_precede_it_is_done(sandbox: Sandbox) -> None:
    """The stage gets its order first and sets the sandbox up while the launcher writes the launch
    record; it execs the agent only once the launcher says so, and never if that step fails."""
    from enforcer.sandbox import launcher
    from enforcer.sandbox.stage import new_session_id, prepare

    marker = sandbox.ws / "ran"
    seen: list[bool] = []

    def run(session: str, before_agent: Callable[[], None]) -> Any:
        prepared = prepare(session, cgroup_group=sandbox.group)
        try:
            return launcher.run(
                _marker_plan(sandbox, marker),
                session,
                prepared=prepared,
                cgroup_group=sandbox.group,
                uid=65534,
                gid=65534,
                before_agent=before_agent,
            )
        finally:
            prepared.discard()

    def slow_record() -> None:
        time.sleep(0.5)  # the stage has its order and is ready long before this returns
        seen.append(marker.exists())

    outcome = run(new_session_id(), slow_record)
    assert seen == [False] and outcome.exit_code == 0 and marker.exists()

    marker.unlink()
    session = new_session_id()

    def record_failed() -> None:
        time.sleep(0.3)
        raise OSError("the launch record could not be written")

    with pytest.raises(OSError, match="launch record could not be written"):
        run(session, record_failed)
    time.sleep(0.3)
    assert not marker.exists()
    assert session not in session_cgroups(sandbox.group)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]
