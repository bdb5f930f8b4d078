"""Shared set-up for tests that launch real sandboxes: a temporary workspace, a policy for it, and a
runner for adl-exec that returns the exit code, output and the session's audit records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit.query import iter_records
from enforcer.sandbox import cgroups

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox tests need root (CI runs as root)")


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
        self.env: dict[str, str] = {}  # extra environment for adl-exec
        for d in (self.ws, self.ref, self.outside):
            d.mkdir(parents=True)
        (self.ws / "notes.txt").write_text("workspace notes\n")
        (self.ws / "secret.txt").write_text("DENIED-CONTENT\n")
        (self.ws / "key.pem").write_text("PEM-CONTENT\n")
        (self.ref / "doc.txt").write_text("reference doc\n")
        (self.outside / "private.txt").write_text("OUTSIDE-CONTENT\n")
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
    ) -> Result:
        environ = {
            **os.environ,
            "ADL_ENFORCER_AUDIT_DIR": str(self.audit),
            "ADL_ENFORCER_AUDIT_KEY": str(self.root / "audit-key.pem"),
            "ADL_ENFORCER_CACHE_DIR": str(self.root / "policy-cache"),
            **self.env,
            **(env or {}),
        }
        before = {r["seq"] for r in self._records()}
        proc = subprocess.run(
            [
                *self.wrap,
                sys.executable,
                "-m",
                "enforcer.cli.exec",
                "--adl",
                str(policy or self.policy()),
                "--report",
                *args,
                "--",
                *command,
            ],
            capture_output=True,
            text=True,
            env=environ,
            timeout=timeout,
        )
        records = [r for r in self._records() if r["seq"] not in before]
        return Result(proc.returncode, proc.stdout, proc.stderr, records)

    def python(self, code: str, **kw: Any) -> Result:
        return self.run("python3", "-c", code, **kw)

    def _records(self) -> list[dict[str, Any]]:
        return list(iter_records(self.audit)) if self.audit.exists() else []


def session_cgroups() -> list[str]:
    """Sessions left under the enforcer's cgroup in any hierarchy."""
    return sorted(cgroups.existing())


@pytest.fixture
def sandbox(tmp_path: Path):  # type: ignore[no-untyped-def]
    box = Sandbox(tmp_path)
    yield box
    assert session_cgroups() == [], "a session cgroup was left behind"
