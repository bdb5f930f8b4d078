"""Shared set-up for tests that launch real sandboxes: a temporary workspace, a policy for it, and a
runner for adl-exec that returns the exit code, output and the session's audit records."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit.query import iter_records
from enforcer.sandbox import cgroups

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox tests need root (CI runs as root)")

# The agents' identity in tests: nobody/nogroup owns nothing on the host. adl-exec refuses to run an
# agent as root, so every test launch names it and every workspace is chowned to it.
AGENT_UID = AGENT_GID = 65534

# The start of an attack probe run by the agent: check(label, fn) prints ESCAPED when fn got
# through and BLOCKED with the errno when the kernel refused it; the tests read those lines.
PROBE_CHECK = """
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(label, fn):
    try:
        fn()
        print("ESCAPED", label)
    except OSError as exc:
        print("BLOCKED", label, exc.errno)
"""
AGENT_USER = f"{AGENT_UID}:{AGENT_GID}"


@contextlib.contextmanager
def agent_tmp_dir() -> Iterator[Path]:
    """A temporary directory the agent's uid can traverse (not list). pytest's own are below a 0700
    directory whose mode every pytest run resets."""
    root = Path(tempfile.mkdtemp(prefix="adl-test-"))
    try:
        root.chmod(0o711)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def agent_tmp_path() -> Iterator[Path]:
    with agent_tmp_dir() as root:
        yield root


def give_to_agent(path: Path) -> None:
    """chown -R to the agent's identity: what an operator does with a workspace."""
    for d in (path, *path.rglob("*")):
        os.chown(d, AGENT_UID, AGENT_GID, follow_symlinks=False)


@dataclass
class Result:
    code: int
    out: str
    err: str
    records: list[dict[str, Any]]

    def kinds(self) -> list[str]:
        return [r["intent"].removeprefix("adl.enforcer.") for r in self.records]

    def record(self, kind: str) -> dict[str, Any]:
        return next(r for r in self.records if r["intent"] == f"adl.enforcer.{kind}")


class Sandbox:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ws = root / "workspace"
        self.ref = root / "reference"
        self.outside = root / "outside"
        self.audit = root / "audit"
        self.wrap: list[str] = []  # a prefix for adl-exec (the network lab's nsenter)
        self.user: str | None = AGENT_USER  # adl-exec --user (None: pass none)
        self.env: dict[str, str] = {}  # extra environment for adl-exec
        self.group = "adl-test-" + secrets.token_hex(4)  # its own cgroup directory: other runs' sessions are not ours
        for d in (self.ws, self.ref, self.outside):
            d.mkdir(parents=True)
        (self.ws / "notes.txt").write_text("workspace notes\n")
        (self.ws / "secret.txt").write_text("DENIED-CONTENT\n")
        (self.ws / "key.pem").write_text("PEM-CONTENT\n")
        (self.ref / "doc.txt").write_text("reference doc\n")
        (self.outside / "private.txt").write_text("OUTSIDE-CONTENT\n")
        give_to_agent(self.ws)
        self.permissions: dict[str, Any] = {
            "filesystem": {
                "allowed_paths": [
                    {"path": f"{self.ws}/**", "access": "read_write"},
                    {"path": f"{self.ref}/**", "access": "read"},
                ],
                "denied_paths": [f"{self.ws}/secret.txt", f"{root}/**/*.pem"],
            },
            "environment": {"allowed_variables": ["LANG", "ALLOWED_*"], "denied_variables": ["ALLOWED_SECRET"]},
            "execution": {"allowed_commands": ["python3", "cat", "ls"], "allow_shell": False},
            "resource_limits": {"max_memory_mb": 64, "max_cpu_percent": 20, "max_duration_sec": 5},
        }

    def policy(self, **overrides: Any) -> Path:
        permissions = {**self.permissions, **overrides.pop("permissions", {})}
        doc = {
            "adl_spec": "0.3.0",
            "id": "urn:adl:agent:test:sandboxed:1.0.0",
            "name": "Sandboxed",
            "description": "integration test agent",
            "version": "1.0.0",
            "data_classification": {"sensitivity": "internal"},
            "permissions": {k: v for k, v in permissions.items() if v is not None},
            **overrides,
        }
        path = self.root / "agent.adl.json"
        path.write_text(json.dumps(doc))
        return path

    def run(
        self,
        *command: str,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        timeout: float = 60,
        policy: Path | None = None,
        stdout: Path | None = None,
    ) -> Result:
        """Run adl-exec; `stdout`: a file (owned by the agent) instead of a pipe for the command's
        output: an agent of another uid cannot reopen the caller's pipes through /dev/stdout."""
        environ = self.environ(env)
        before = {r["seq"] for r in self._records()}
        with contextlib.ExitStack() as files:
            sink = files.enter_context(stdout.open("a")) if stdout is not None else subprocess.PIPE
            proc = subprocess.run(
                self.exec_argv(*command, args=("--report", *args), policy=policy),
                stdout=sink,
                stderr=subprocess.PIPE,
                text=True,
                env=environ,
                timeout=timeout,
            )
        out = stdout.read_text() if stdout is not None else proc.stdout
        records = [r for r in self._records() if r["seq"] not in before]
        return Result(proc.returncode, out, proc.stderr, records)

    def exec_argv(self, *command: str, args: tuple[str, ...] = (), policy: Path | None = None) -> list[str]:
        """adl-exec's command line for `command` in this sandbox (after `self.wrap`), as the agent's
        user; `args`: more options before `--`."""
        return [
            *self.wrap,
            sys.executable,
            "-m",
            "enforcer.cli.exec",
            "--adl",
            str(policy or self.policy()),
            *(("--user", self.user) if self.user is not None else ()),
            *args,
            "--",
            *command,
        ]

    def run_session(self, policy: Any, plan: Any, writer: Any, session: str, prepared: Any, **kw: Any) -> Any:
        """enforcer.session.run_session of a stage prepared in this sandbox's cgroup group, as the
        agents' test user; the stage discarded and the writer closed whatever happens."""
        from enforcer.session import run_session

        try:
            return run_session(
                policy, plan, writer, session, uid=65534, gid=65534, cgroup_group=self.group, prepared=prepared, **kw
            )
        finally:
            prepared.discard()
            writer.close()

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """adl-exec's environment for this sandbox: its own audit log and key, cgroup group and
        policy cache, then `self.env` and `extra`."""
        return {
            **os.environ,
            "ADL_ENFORCER_AUDIT_DIR": str(self.audit),
            "ADL_ENFORCER_AUDIT_KEY": str(self.root / "audit-key.pem"),
            "ADL_ENFORCER_CGROUP_GROUP": self.group,
            "ADL_ENFORCER_CACHE_DIR": str(self.root / "policy-cache"),
            **self.env,
            **(extra or {}),
        }

    def python(self, code: str, **kw: Any) -> Result:
        return self.run("python3", "-c", code, **kw)

    def _records(self) -> list[dict[str, Any]]:
        return list(iter_records(self.audit)) if self.audit.exists() else []


def session_cgroups(group: str = cgroups.GROUP) -> list[str]:
    """Sessions left in cgroup directory `group` in any hierarchy."""
    return sorted(cgroups.existing(group=group))


def remove_group(group: str) -> None:
    """Remove a test's cgroup directories, and any session left in them."""
    with contextlib.suppress(OSError):
        for left in cgroups.existing(group=group).values():
            left.remove(timeout=5)
        for base in cgroups.group_directories(group=group):
            with contextlib.suppress(FileNotFoundError):
                base.rmdir()


@pytest.fixture
def sandbox(agent_tmp_path: Path):  # type: ignore[no-untyped-def]
    box = Sandbox(agent_tmp_path)
    try:
        yield box
        assert session_cgroups(box.group) == [], "a session cgroup was left behind"
    finally:
        remove_group(box.group)
