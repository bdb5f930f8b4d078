"""The launch plan's hostile-agent decisions, without a kernel: what stays executable, deny winning
over the runtime baseline, what the guard is started for, and the moved-tree pre-check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from enforcer.policy.patterns import PatternList
from enforcer.sandbox.creation_guard import DeniedNames
from enforcer.sandbox.plan import HostFeatures, PlanError, build_plan, load_baseline

from ..helpers.documents import base_adl, compile_doc

REPO = Path(__file__).resolve().parents[2]
FEATURES = HostFeatures(landlock_abi=7, cgroups="v1")


def plan_for(schemas: Any, permissions: dict[str, Any], argv: list[str] | None = None) -> Any:
    policy = compile_doc(schemas, base_adl(permissions=permissions))
    baseline = load_baseline(REPO / "policies" / "runtime-baseline.yaml")
    return build_plan(policy, argv or ["/bin/true"], baseline=baseline, environ={}, features=FEATURES, cwd="/")


def test_may_match_beneath() -> None:
    names = DeniedNames(PatternList.compile(["/w/**/.aws/credentials", "/w/keys/*.pem", "/x/**"], "path"))
    assert names.may_match_beneath("/w/aws-tmp")  # '**' reaches anything below /w
    assert names.may_match_beneath("/w/keys") and names.may_match_beneath("/x/y/z")
    assert names.may_match_beneath("/w/keys/a.pem")  # '**' again: /w/keys/a.pem/.aws/credentials
    assert not names.may_match_beneath("/v") and not names.may_match_beneath("/v/keys")
    flat = DeniedNames(PatternList.compile(["/w/keys/*.pem"], "path"))
    assert flat.may_match_beneath("/w") and not flat.may_match_beneath("/w/keys/a.pem")
    empty = DeniedNames(PatternList.compile([], "path"))
    assert not empty.may_match_beneath("/w")


def test_only_allowed_programs_and_library_directories_stay_executable(schemas: Any, tmp_path: Path) -> None:
    plan = plan_for(
        schemas,
        {
            "filesystem": {"allowed_paths": [{"path": f"{tmp_path}/**", "access": "read_write"}]},
            "execution": {"allowed_commands": ["true"], "allow_shell": False},
        },
    )
    mounts = plan.exec_mounts
    assert os.path.realpath("/bin/true") in mounts.files
    assert all(not f.startswith(str(tmp_path)) for f in mounts.files + mounts.directories + mounts.trees)
    assert "/usr/bin" not in mounts.directories and "/usr/lib" not in mounts.directories + mounts.trees
    for directory in mounts.directories:  # subdirectories of a library directory are noexec again
        subdirs = [e.path for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
        listed = set(mounts.directories) | set(mounts.trees)
        assert all(d in mounts.noexec or d in listed or any(p.startswith(d + "/") for p in listed) for d in subdirs)
    execution = next(layer for layer in plan.layers if layer.name == "execution")
    assert any("every mount noexec" in d for d in execution.details)


def test_an_allowed_command_inside_a_writable_grant_is_refused(schemas: Any, tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/true\n")
    tool.chmod(0o755)
    with pytest.raises(PlanError, match="writable grant"):
        plan_for(
            schemas,
            {
                "filesystem": {"allowed_paths": [{"path": f"{tmp_path}/**", "access": "read_write"}]},
                "execution": {"allowed_commands": [str(tool)], "allow_shell": False},
            },
            argv=[str(tool)],
        )


def test_deny_wins_over_the_runtime_baseline(schemas: Any) -> None:
    plan = plan_for(schemas, {"filesystem": {"allowed_paths": [], "denied_paths": ["/etc/passwd"]}})
    assert "/etc/passwd" in plan.file_masks
    assert all(path != "/etc/passwd" for path, _ in plan.landlock.rules)
    with pytest.raises(PlanError, match="inside the runtime baseline"):
        plan_for(schemas, {"filesystem": {"allowed_paths": [], "denied_paths": ["/**/*.pem"]}})


def test_the_guard_runs_for_every_writable_grant(schemas: Any, tmp_path: Path) -> None:
    writable = {"allowed_paths": [{"path": f"{tmp_path}/**", "access": "read_write"}]}
    plain = plan_for(schemas, {"filesystem": writable})
    assert plain.seccomp.guard_metadata and not plain.seccomp.guard_creation
    assert plain.creation_denied is not None and plain.creation_denied.writable(str(tmp_path / "x"))
    denied = plan_for(schemas, {"filesystem": {**writable, "denied_paths": [f"{tmp_path}/**/*.pem"]}})
    assert denied.seccomp.guard_creation and denied.seccomp.guard_metadata
    read_only = plan_for(schemas, {"filesystem": {"allowed_paths": [{"path": f"{tmp_path}/**", "access": "read"}]}})
    assert read_only.creation_denied is None and not read_only.seccomp.guarded


GUARD_LOADED = """
import json, os, sys
from pathlib import Path
from enforcer.policy import SchemaSet, spec_root
from enforcer.sandbox.plan import HostFeatures, build_plan, load_baseline
from enforcer.settings.launch import read as read_settings
from tests.helpers.documents import base_adl, compile_doc

schemas = SchemaSet(spec_root(read_settings(os.environ).spec_dir))
baseline = load_baseline(Path("policies/runtime-baseline.yaml"))
features = HostFeatures(landlock_abi=7, cgroups="v1")
seen = []
for access in ("read", "read_write"):
    permissions = {"filesystem": {"allowed_paths": [{"path": sys.argv[1] + "/**", "access": access}]}}
    policy = compile_doc(schemas, base_adl(permissions=permissions))
    plan = build_plan(policy, ["/bin/true"], baseline=baseline, environ={}, features=features, cwd="/")
    seen.append([plan.creation_denied is not None, "enforcer.sandbox.creation_guard" in sys.modules])
print(json.dumps(seen))
"""


def test_a_plan_without_a_guard_does_not_load_the_guard(tmp_path: Path) -> None:
    """The launcher builds the seccomp plan from the guard's syscall lists without loading the guard's
    code; a plan with a writable grant gets its guard (and loads it)."""
    proc = subprocess.run(
        [sys.executable, "-c", GUARD_LOADED, str(tmp_path)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[False, False], [True, True]]
