"""The unit as `adl-enforcerd install-systemd` writes it, under a real systemd booted as PID 1 of a
throwaway root (tests/install/systemd_root.py: overlay of / with a tmpfs upper layer, new mount, PID
and cgroup namespaces, everything but journald and this unit masked). Nothing is written to the
host; PID 1 is killed at the end whatever happens.

Shown: READY=1 (active only after it), `systemctl reload` giving a policy.load record of the new
document and READY=1's new status, a session in the unit's delegated cgroup with its memory limit,
`systemctl stop` ending that session with its exit record, and the watchdog restarting a hung
(SIGSTOPped) daemon. The host's /etc and /tmp are checked unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.install import systemd_root

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.prefix) / "bin" / "adl-enforcerd"
EXAMPLES = REPO / "policies" / "examples"

why_not = systemd_root.available()
pytestmark = [
    pytest.mark.install,
    pytest.mark.systemd_boot,
    pytest.mark.skipif(why_not is not None, reason=f"cannot boot systemd here: {why_not}"),
]

# A short watchdog for the test only; the installed unit keeps its own values.
DROP_IN = "[Service]\nWatchdogSec=3\nTimeoutAbortSec=2\nRestartSec=1\n"


def _prepare_command() -> list[str]:
    script = f"""set -e
root=$1
{ENTRY} install-systemd --root "$root" >/dev/null
systemd-sysusers --root="$root" >/dev/null
systemd-tmpfiles --root="$root" --create "$root/etc/tmpfiles.d/adl-enforcer.conf"
cp {EXAMPLES / "coding-agent.adl.json"} "$root/etc/adl-enforcer/policies/"
echo 'agent_callers = {{ "*" = ["group:adl-enforcer"] }}' >> "$root/etc/adl-enforcer/enforcer.toml"
mkdir -p "$root/etc/systemd/system/adl-enforcerd.service.d"
printf '%s' '{DROP_IN}' > "$root/etc/systemd/system/adl-enforcerd.service.d/test-watchdog.conf"
{sys.executable} {Path(systemd_root.__file__)} adl-enforcerd.service "$root"
"""
    return ["bash", "-c", script, "prepare"]


HOST_UNIT = Path("/etc/systemd/system/adl-enforcerd.service")


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[systemd_root.Booted]:
    sentinel = Path(tempfile.mkstemp(prefix="adl-boot-sentinel-", dir="/tmp")[1])
    unit_before = HOST_UNIT.exists()
    machine = systemd_root.boot(tmp_path_factory.mktemp("boot"), _prepare_command(), timeout=90)
    try:
        yield machine
    finally:
        machine.close()
        try:
            assert sentinel.exists(), "a file in the host's /tmp disappeared"
            assert HOST_UNIT.exists() == unit_before, "the host's /etc changed"
            assert all(not c.exists() for c in machine.cgroups), "the boot's cgroups were not removed"
        finally:
            sentinel.unlink(missing_ok=True)


def show(machine: systemd_root.Booted, *properties: str) -> dict[str, str]:
    result = machine.run("systemctl", "show", "adl-enforcerd", *(f"-p{p}" for p in properties))
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def audit(machine: systemd_root.Booted, *filters: str) -> list[dict]:
    result = machine.run(
        str(Path(sys.prefix) / "bin" / "adl-audit"), "--dir", "/var/log/adl-enforcer", "search", "--json", *filters
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def journal(machine: systemd_root.Booted) -> str:
    return machine.run("journalctl", "--no-pager", "-o", "cat", "-u", "adl-enforcerd").stdout


def test_ready_after_notify(booted: systemd_root.Booted) -> None:
    wait_for(lambda: show(booted, "ActiveState")["ActiveState"] == "active", 30, "the unit to be active")
    state = show(booted, "Type", "ActiveState", "SubState", "StatusText", "ExecMainStartTimestampMonotonic")
    assert state["Type"] == "notify" and state["SubState"] == "running", state
    assert state["StatusText"].startswith("serving 1 agent"), state


def test_reload_records_the_new_generation(booted: systemd_root.Booted) -> None:
    wait_for(lambda: show(booted, "ActiveState")["ActiveState"] == "active", 30, "the unit to be active")
    before = audit(booted, "--type", "policy.load")
    copy = booted.run("cp", str(EXAMPLES / "research-agent.adl.json"), "/etc/adl-enforcer/policies/")
    assert copy.returncode == 0, copy.stderr
    reload = booted.run("systemctl", "reload", "adl-enforcerd")
    assert reload.returncode == 0, reload.stderr

    def recorded() -> bool:
        new = [r for r in audit(booted, "--type", "policy.load") if r not in before]
        return any(r["payload"].get("agent", "").lower().startswith("research") for r in new)

    # systemd 252 ends the reload job when ExecReload's kill returns; the daemon's RELOADING=1 may come
    # just after it, so the record is awaited (briefly) rather than assumed.
    wait_for(recorded, 10, "the policy.load record of the reload")
    wait_for(lambda: show(booted, "StatusText")["StatusText"].startswith("serving 2 agent"), 10, "READY=1 status")
    assert "Reloaded" in journal(booted)


def test_session_runs_in_the_delegated_cgroup_and_stop_records_its_exit(booted: systemd_root.Booted) -> None:
    wait_for(lambda: show(booted, "ActiveState")["ActiveState"] == "active", 30, "the unit to be active")
    command = ["adl-exec", "--daemon", "unix:/run/adl-enforcer/launch.sock", "--agent", "Coding Agent", "--"]
    # As an unprivileged member of the socket group (agents never run as root; agent_callers above).
    enter = ["nsenter", "-t", str(booted.pid1), "-m", "-p", "-C", "--", "setpriv", "--reuid=65534", "--regid=65534"]
    enter += ["--groups=adl-enforcer", "--"]
    agent = subprocess.Popen(
        [
            *enter,
            str(Path(sys.prefix) / "bin" / command[0]),
            *command[1:],
            "python3",
            "-c",
            "import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = "/sys/fs/cgroup/pids/system.slice/adl-enforcerd.service/adl-enforcerd"

        def agent_in_a_session() -> bool:
            if agent.poll() is not None:
                raise AssertionError(f"adl-exec ended {agent.returncode}: {agent.communicate()[1]}")
            listing = booted.run("sh", "-c", f"cat {base}/*/cgroup.procs 2>/dev/null")
            cmdlines = [booted.run("cat", f"/proc/{pid}/cmdline").stdout for pid in listing.stdout.split()]
            return any("time.sleep(60)" in c for c in cmdlines)

        # The launch stage joins the session's cgroup first and becomes the agent by exec.
        wait_for(agent_in_a_session, 30, "the agent in a session cgroup below the unit's")
        memory = booted.run("sh", "-c", f"cat {base.replace('/pids/', '/memory/')}/*/memory.limit_in_bytes")
        assert str(256 * 1024 * 1024) in memory.stdout.split(), memory.stdout

        stop = booted.run("systemctl", "stop", "adl-enforcerd", timeout=60)
        assert stop.returncode == 0, stop.stderr
        agent.wait(timeout=30)
        launches = [r for r in audit(booted, "--type", "launch") if r["payload"].get("agent") == "Coding Agent"]
        exits = {r["corr"]: r["payload"] for r in audit(booted, "--type", "exit")}
        ended = exits.get(launches[-1]["corr"])
        assert ended and ended["reason"] == "signal" and ended["agent"] == "Coding Agent", ended
        (stopped,) = audit(booted, "--type", "daemon.stop")[-1:]
        assert stopped["payload"]["sessions_ended"] >= 1, stopped
        assert agent.returncode != 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)
    start = booted.run("systemctl", "start", "adl-enforcerd")
    assert start.returncode == 0, start.stderr


def test_watchdog_restarts_a_hung_daemon(booted: systemd_root.Booted) -> None:
    wait_for(lambda: show(booted, "ActiveState")["ActiveState"] == "active", 30, "the unit to be active")
    first = show(booted, "MainPID", "NRestarts")
    stopped = booted.run("kill", "-STOP", first["MainPID"])
    assert stopped.returncode == 0, stopped.stderr

    def restarted() -> bool:
        now = show(booted, "MainPID", "NRestarts", "ActiveState")
        return now["ActiveState"] == "active" and now["MainPID"] not in ("0", first["MainPID"])

    wait_for(restarted, 30, "the watchdog to restart the daemon")
    assert int(show(booted, "NRestarts")["NRestarts"]) > int(first["NRestarts"])
    assert "Watchdog timeout" in journal(booted)


def test_daemon_reload_and_enable_now_as_the_readme_installs(booted: systemd_root.Booted) -> None:
    """The last line of README.md's install: `systemctl daemon-reload && systemctl enable --now adl-enforcerd`."""
    assert show(booted, "UnitFileState")["UnitFileState"] == "disabled"  # the boot only wants it
    reload = booted.run("systemctl", "daemon-reload")
    assert reload.returncode == 0, reload.stderr
    enable = booted.run("systemctl", "enable", "--now", "adl-enforcerd")
    assert enable.returncode == 0, enable.stderr
    wait_for(lambda: show(booted, "ActiveState")["ActiveState"] == "active", 30, "the unit to be active")
    assert show(booted, "UnitFileState")["UnitFileState"] == "enabled"
