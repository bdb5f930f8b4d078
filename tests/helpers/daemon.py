"""A real adl-enforcerd on temporary sockets, for integration tests.

Each instance has its own policy directory, audit log and cgroup directory name, and is stopped
(SIGTERM, then SIGKILL) and its cgroups removed even when the test fails.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from enforcer.audit.query import iter_records
from enforcer.daemon.spawner import HELPERS_SUFFIX
from enforcer.sandbox import cgroups
from enforcer.v1 import enforcer_pb2 as pb
from enforcer.v1 import enforcer_pb2_grpc as pb_grpc

from .sandbox import AGENT_GID, AGENT_UID, Sandbox

REPO = Path(__file__).resolve().parents[2]

TOOLS = [
    {
        "name": "read_note",
        "description": "read a note",
        "read_only": True,
        "parameters": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
            "additionalProperties": False,
        },
    },
    {
        "name": "pay",
        "description": "move money",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}, "additionalProperties": False},
    },
    {
        "name": "delete_note",
        "description": "delete a note",
        "requires_confirmation": True,
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
]

FAST_AAIF = {
    "sc_standard": "SC-006",
    "sc_version": "3.2.0",
    "agent_id": "a1c0ffee-0000-4000-8000-00000000fa57",
    "status": "active",
    "agent": {
        "name": "Fast",
        "goal": "approvals that expire quickly",
        "compliance": {
            "safety_level": "standard",
            "audit_log": True,
            "human_in_the_loop": {
                "enabled": True,
                "trigger": {"lang": "jsonlogic", "expr": {">": [{"var": "arguments.amount"}, 100]}},
                "timeout_seconds": 1,
            },
        },
    },
}


class RunningDaemon:
    def __init__(self, root: Path, box: Sandbox) -> None:
        self.root = root
        self.box = box
        self.policies = root / "policies"
        self.policies.mkdir()
        self.audit = root / "daemon-audit"
        self.api = root / "api.sock"
        self.admin = root / "admin.sock"
        self.launch = root / "launch.sock"
        self.group = "adl-test-" + secrets.token_hex(4)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "daemon.log"
        self._channels: list[grpc.Channel] = []
        self.extra_env: dict[str, str] = {}
        self.wrap: list[str] = []  # a prefix for the daemon (the network lab's nsenter)
        self.program = ["-m", "enforcer.cli.enforcerd"]  # what the interpreter runs

    # -- policies -------------------------------------------------------------------------------

    def write_agents(self, max_concurrent: int | None = 1) -> None:
        limits = dict(self.box.permissions["resource_limits"])
        if max_concurrent is not None:
            limits["max_concurrent"] = max_concurrent
        permissions = {**self.box.permissions, "resource_limits": limits}
        self.write_adl("sandboxed", "Sandboxed", permissions)
        self.write_adl("fast", "Fast", {})
        (self.policies / "fast.aaif.json").write_text(json.dumps(FAST_AAIF))

    def write_adl(self, stem: str, name: str, permissions: dict[str, Any], **extra: Any) -> Path:
        doc = {
            "adl_spec": "0.3.0",
            "name": name,
            "description": "daemon test agent",
            "version": "1.0.0",
            "data_classification": {"sensitivity": "internal"},
            "tools": TOOLS,
            **({"permissions": permissions} if permissions else {}),
            **extra,
        }
        path = self.policies / f"{stem}.adl.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.rename(path)  # a reload never sees half a file
        return path

    # -- process --------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ADL_ENFORCER_POLICY_DIR": str(self.policies),
            "ADL_ENFORCER_SOCKET": str(self.api),
            "ADL_ENFORCER_ADMIN_SOCKET": str(self.admin),
            "ADL_ENFORCER_LAUNCH_SOCKET": str(self.launch),
            "ADL_ENFORCER_AUDIT_DIR": str(self.audit),
            "ADL_ENFORCER_AUDIT_KEY": str(self.root / "audit-key.pem"),
            "ADL_ENFORCER_CGROUP_GROUP": self.group,
            "ADL_ENFORCER_AUDIT_RETRY_S": "0.2",
            # The clients run as the agents' identity (the daemon runs a session as its caller's uid).
            "ADL_ENFORCER_SOCKET_GROUP": grp.getgrgid(AGENT_GID).gr_name,
            # ... and the operator lets that identity launch and Check as every test agent.
            "ADL_ENFORCER_AGENT_CALLERS": json.dumps({"*": [f"uid:{AGENT_UID}"]}),
            **self.extra_env,
        }

    def start(self, wait: bool = True) -> None:
        log = open(self.log, "ab")  # noqa: SIM115 (the daemon keeps it)
        self.proc = subprocess.Popen(
            [*self.wrap, sys.executable, *self.program], env=self.env(), stdout=log, stderr=log
        )
        log.close()
        if wait:
            self.wait_serving()

    def wait_serving(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"adl-enforcerd exited {self.proc.returncode}:\n{self.log.read_text()}")
            if self.api.exists() and self.health() == "SERVING":
                return
            time.sleep(0.05)
        raise AssertionError(f"adl-enforcerd not serving after {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> int | None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=5)

    def cleanup(self) -> None:
        self.stop()
        # The sessions' group and the helpers' (supervisors, egress filters), which a spawner killed
        # by a test leaves behind.
        for group_name in (self.group, self.group + HELPERS_SUFFIX):
            with contextlib.suppress(OSError):
                for group in cgroups.existing(group=group_name).values():
                    group.remove(timeout=5)
                for base in cgroups.group_directories(group=group_name):
                    with contextlib.suppress(FileNotFoundError):
                        base.rmdir()

    def sessions_left(self) -> list[str]:
        return sorted(cgroups.existing(group=self.group))

    # -- clients --------------------------------------------------------------------------------

    def channel(self, admin: bool = False) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix:{self.admin if admin else self.api}")
        self._channels.append(channel)
        return channel

    def enforcer(self, admin: bool = False) -> pb_grpc.EnforcerStub:
        return pb_grpc.EnforcerStub(self.channel(admin))

    def admin_stub(self) -> pb_grpc.AdminStub:
        return pb_grpc.AdminStub(self.channel(admin=True))

    def health(self) -> str:
        stub = health_pb2_grpc.HealthStub(self.channel())
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return "DOWN"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def records(self) -> list[dict[str, Any]]:
        return list(iter_records(self.audit)) if self.audit.exists() else []

    def exec_argv(self, *command: str, agent: str = "Sandboxed", options: tuple[str, ...] = ()) -> list[str]:
        """adl-exec --daemon for this daemon's launch socket, run as the agents' test identity (the
        daemon refuses to run an agent for a root caller)."""
        launch = ["--daemon", f"unix:{self.launch}", "--agent", agent]
        as_agent = ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_GID}", "--clear-groups"]
        return [*as_agent, sys.executable, "-m", "enforcer.cli.exec", *launch, *options, "--", *command]

    def adl_exec(self, *command: str, agent: str = "Sandboxed", timeout: float = 60) -> Any:
        argv = self.exec_argv(*command, agent=agent, options=("--report",))
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def tool_request(agent: str, name: str, arguments: Any, **kw: Any) -> pb.CheckRequest:
    return pb.CheckRequest(agent=agent, tool=pb.ToolCall(name=name, arguments_json=json.dumps(arguments)), **kw)


@pytest.fixture
def daemon(agent_tmp_path: Path) -> Iterator[RunningDaemon]:
    box = Sandbox(agent_tmp_path / "box")
    running = RunningDaemon(agent_tmp_path, box)
    running.write_agents()
    try:
        running.start()
        yield running
    finally:
        running.cleanup()
    assert running.sessions_left() == [], "a session cgroup was left behind"
