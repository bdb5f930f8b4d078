"""Each layer of the launch plan on its own, without root or a kernel: temporary trees for paths,
HostFeatures values for the host, policies compiled from small documents."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from enforcer.egress_values import EgressValues
from enforcer.policy.model import Lifecycle
from enforcer.policy.patterns import PatternList
from enforcer.sandbox import landlock
from enforcer.sandbox.creation_guard import DeniedNames
from enforcer.sandbox.plan import (
    Baseline,
    HostFeatures,
    Masks,
    PlanError,
    Unenforced,
    baseline_grants,
    build_plan,
    check_request,
    denied_masks,
    environment,
    execution,
    filesystem,
    landlock_rules,
    network,
    privileges,
    residual,
    resources,
    syscalls,
)
from enforcer.settings.launch import read as read_settings

from ..helpers.documents import base_adl, compile_doc

NETWORK = {"network": {"allowed_hosts": ["api.example.test"], "allowed_ports": [443]}}


def policy_with(schemas: Any, **permissions: Any) -> Any:
    return compile_doc(schemas, base_adl(permissions=permissions))


def baseline_in(root: Path, **fields: Any) -> Baseline:
    values: dict[str, Any] = {
        "path": root / "baseline.yaml",
        "digest": "sha256:" + "0" * 64,
        "read": (),
        "read_write": (),
        "read_device": (),
        "execute": (),
        "proc_self": False,
        "search_path": str(root / "bin"),
    }
    values.update(fields)
    return Baseline(**values)


def tree(root: Path, *files: str) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")


def program(directory: Path, name: str) -> Path:
    """An executable file (a copy of true) under `name`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    shutil.copy(os.path.realpath("/bin/true"), path)
    path.chmod(0o755)
    return path


# -- what a host cannot enforce


def test_unenforced_refuses_unless_accepted_or_explained() -> None:
    strict = Unenforced(frozenset())
    assert strict.status("network", None) == "active"
    with pytest.raises(PlanError, match=r"needs nft; refusing to run with 'network' unenforced"):
        strict.status("network", "needs nft")
    assert strict.accepted == [] and strict.refusals == []

    accepting = Unenforced(frozenset({"resources"}))
    assert accepting.status("resources", "no cgroups") == "accepted-unenforced"
    assert accepting.accepted == ["resources"] and accepting.refusals == []
    with pytest.raises(PlanError, match="'network' unenforced"):  # accepting one domain accepts no other
        accepting.status("network", "needs nft")

    explaining = Unenforced(frozenset(), explain_only=True)
    assert explaining.status("filesystem", "no Landlock") == "unavailable"
    assert explaining.status("resources", "no cgroups") == "unavailable"
    assert explaining.accepted == []
    assert explaining.refusals == [
        "no Landlock; refusing to run with 'filesystem' unenforced (--accept-unenforced filesystem to accept)",
        "no cgroups; refusing to run with 'resources' unenforced (--accept-unenforced resources to accept)",
    ]


def test_check_request_refuses_the_document_and_the_command_line(schemas: Any) -> None:
    policy = policy_with(schemas)
    check_request(policy, ["/bin/true"], frozenset({"network"}))
    with pytest.raises(PlanError, match=r"--accept-unenforced takes .*; not bogus"):
        check_request(policy, ["/bin/true"], frozenset({"bogus", "network"}))
    with pytest.raises(PlanError, match="no command given"):
        check_request(policy, [], frozenset())
    expired = dataclasses.replace(policy, lifecycle=Lifecycle("retired", "refuse", "the agent is retired"))
    with pytest.raises(PlanError, match="lifecycle: the agent is retired"):
        check_request(expired, ["/bin/true"], frozenset())
    with pytest.raises(PlanError, match="signature does not verify"):
        check_request(dataclasses.replace(policy, signature="invalid"), ["/bin/true"], frozenset())


# -- filesystem


def test_baseline_grants_what_exists_and_masks_what_a_denied_pattern_names(tmp_path: Path) -> None:
    tree(tmp_path, "lib/libc.so", "lib/keys/a.key", "lib/keys/b.txt", "etc/passwd", "etc/hosts", "dev/null", "ld.so")
    base = baseline_in(
        tmp_path,
        read=(f"{tmp_path}/lib", f"{tmp_path}/etc/passwd", f"{tmp_path}/etc/hosts", f"{tmp_path}/absent"),
        read_write=(f"{tmp_path}/dev/null",),
        execute=(f"{tmp_path}/ld.so",),
        proc_self=True,
    )
    denied = PatternList.compile([f"{tmp_path}/etc/passwd", f"{tmp_path}/lib/**/*.key"], "path")
    part = baseline_grants(base, denied, "/", "/")
    assert part.grants == [
        (f"{tmp_path}/lib", landlock.READ),
        (f"{tmp_path}/etc/hosts", landlock.READ),
        (f"{tmp_path}/dev/null", landlock.READ | landlock.WRITE_FILE | landlock.TRUNCATE),
        (f"{tmp_path}/ld.so", landlock.READ_FILE | landlock.EXECUTE),
    ]
    # Deny wins over the baseline: a listed file it names, and what it matches inside a listed directory.
    assert part.masks.files == [f"{tmp_path}/etc/passwd", f"{tmp_path}/lib/keys/a.key"] and part.masks.dirs == []
    assert (
        f"  baseline read: {tmp_path}/etc/passwd DENIED by {tmp_path}/etc/passwd: masked, not granted" in part.details
    )
    assert f"  baseline {tmp_path}/lib: {tmp_path}/lib/keys/a.key DENIED by {tmp_path}/lib/**/*.key: masked" in (
        part.details
    )
    assert not any("absent" in d for d in part.details)  # a missing path is skipped, not granted
    assert any("/proc/self" in d for d in part.details)

    undenied = baseline_grants(base, None, "/", "/")
    assert (f"{tmp_path}/etc/passwd", landlock.READ) in undenied.grants and undenied.masks == Masks()


def test_baseline_masks_refuse_a_pattern_too_wide_to_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree(tmp_path, *(f"lib/d{i}/f" for i in range(6)))
    monkeypatch.setattr("enforcer.sandbox.plan.MAX_MASK_WALK", 5)
    denied = PatternList.compile([f"{tmp_path}/**/secret"], "path")
    with pytest.raises(PlanError, match="more than 5 entries to check; narrow the pattern"):
        baseline_grants(baseline_in(tmp_path, read=(f"{tmp_path}/lib",)), denied, "/", "/")


def test_filesystem_grants_literal_prefixes_that_exist(schemas: Any, tmp_path: Path) -> None:
    tree(tmp_path, "rw/a", "ro/a.txt")
    fs = policy_with(
        schemas,
        filesystem={
            "allowed_paths": [
                {"path": f"{tmp_path}/rw/**", "access": "read_write"},
                {"path": f"{tmp_path}/ro/*.txt", "access": "read"},
                {"path": f"{tmp_path}/gone/**", "access": "write"},
            ]
        },
    ).filesystem
    base = baseline_grants(baseline_in(tmp_path), None, "/", "/")
    part = filesystem(fs, base, "/", "/", abi=5)
    assert part.grants == [(f"{tmp_path}/rw", landlock.READ | landlock.WRITE), (f"{tmp_path}/ro", landlock.READ)]
    assert part.writable == [f"{tmp_path}/rw"]
    assert part.layer.name == "filesystem" and part.layer.mechanism == "Landlock ABI 5"
    assert part.layer.details == [
        f"read_write {tmp_path}/rw/**",
        f"read       {tmp_path}/ro/*.txt (Landlock grants all of {tmp_path}/ro)",
        f"write      {tmp_path}/gone/**: {tmp_path}/gone does not exist, nothing granted",
        *base.details,  # the baseline after the declared grants
    ]

    undeclared = filesystem(None, base, "/", "/", abi=0)
    assert undeclared.grants == [] and undeclared.writable == [] and undeclared.layer.mechanism == "Landlock"
    assert undeclared.layer.details[0].startswith("no filesystem permission declared")


def test_denied_masks_hide_every_name_of_a_denied_file(schemas: Any, tmp_path: Path) -> None:
    tree(tmp_path, "w/.env", "w/ok", "w/secret/k", "w/sub/x.pem")
    os.link(tmp_path / "w/.env", tmp_path / "w/alias")
    os.symlink(tmp_path / "w/.env", tmp_path / "w/link")  # a symbolic link is no name of the file
    fs = policy_with(
        schemas,
        filesystem={
            "allowed_paths": [{"path": f"{tmp_path}/w/**", "access": "read_write"}],
            "denied_paths": [f"{tmp_path}/**/.env", f"{tmp_path}/w/secret", f"{tmp_path}/**/*.pem"],
        },
    ).filesystem
    inherited = Masks(["/etc/passwd"], [])
    layer, masks = denied_masks(fs, "/", "/", inherited, guarded=True)
    assert inherited == Masks(["/etc/passwd"], [])  # the baseline's masks are extended, not changed
    assert masks.files[0] == "/etc/passwd"
    assert sorted(masks.files[1:]) == sorted([f"{tmp_path}/w/.env", f"{tmp_path}/w/alias", f"{tmp_path}/w/sub/x.pem"])
    assert masks.dirs == [f"{tmp_path}/w/secret"]  # masked whole, not walked
    assert layer.status == "active"
    assert layer.details[1] == "masked at launch: 4 file(s), 1 directorie(s)"
    assert "creation guard" in layer.details[-1]

    unguarded, _ = denied_masks(fs, "/", "/", Masks(), guarded=False)
    assert unguarded.details[-1] == "created after launch: nothing can be created (no writable grant)"

    open_fs = policy_with(schemas, filesystem={"allowed_paths": [{"path": f"{tmp_path}/w/**", "access": "read"}]})
    layer, masks = denied_masks(open_fs.filesystem, "/", "/", inherited, guarded=False)
    assert layer.status == "not declared" and masks == inherited


# -- execution


def test_execution_grants_allowed_binaries_and_never_a_shell(schemas: Any, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool, shell = program(bin_dir, "tool"), program(bin_dir, "sh")
    program(bin_dir, "other")
    program(tmp_path / "real", "dash")
    (bin_dir / "run").symlink_to(tmp_path / "real/dash")  # a shell under another name is still a shell
    policy = policy_with(schemas, execution={"allowed_commands": ["tool", "sh", "run"], "allow_shell": False})
    part = execution(policy, ["tool", "-x"], baseline_in(tmp_path), "/", [], abi=6)
    assert part.executable == str(tool)
    assert part.grants == [(str(tool), landlock.READ_FILE | landlock.EXECUTE)]  # sh and run: never executable
    assert part.mounts.files == [str(tool)]
    assert part.layer.mechanism == "Landlock EXECUTE (ABI 6) + noexec mounts"
    assert f"executable: {tool}; shells never executable" in part.layer.details

    with pytest.raises(PlanError, match="the command itself is not allowed"):
        execution(policy, [str(shell)], baseline_in(tmp_path), "/", [], abi=6)
    with pytest.raises(PlanError, match=re.escape(f"command not found: nothing (searched {bin_dir})")):
        execution(policy, ["nothing"], baseline_in(tmp_path), "/", [], abi=6)

    shells = policy_with(schemas, execution={"allowed_commands": ["sh"], "allow_shell": True})
    assert execution(shells, ["sh"], baseline_in(tmp_path), "/", [], abi=6).grants == [
        (str(shell), landlock.READ_FILE | landlock.EXECUTE)
    ]


def test_execution_without_rules_runs_only_the_command(schemas: Any, tmp_path: Path) -> None:
    tool = program(tmp_path / "bin", "tool")
    program(tmp_path / "bin", "other")
    part = execution(policy_with(schemas), ["tool"], baseline_in(tmp_path), "/", [], abi=6)
    assert part.grants == [(str(tool), landlock.READ_FILE | landlock.EXECUTE)]
    assert f"no execution permission declared: only {tool} may run" in part.layer.details


def test_execution_refuses_a_command_in_a_writable_grant_and_keeps_libraries_there_noexec(
    schemas: Any, tmp_path: Path
) -> None:
    tool = program(tmp_path / "bin", "tool")
    (tmp_path / "lib/sub").mkdir(parents=True)
    (tmp_path / "w/lib").mkdir(parents=True)
    policy = policy_with(schemas, execution={"allowed_commands": ["tool"]})
    with pytest.raises(PlanError, match=re.escape(f"allowed command {tool} lies in the writable grant {tmp_path}/bin")):
        execution(policy, ["tool"], baseline_in(tmp_path), "/", [f"{tmp_path}/bin"], abi=6)

    libraries = baseline_in(tmp_path, library=(f"{tmp_path}/lib", f"{tmp_path}/w/lib"))
    part = execution(policy, ["tool"], libraries, "/", [f"{tmp_path}/w"], abi=6)
    assert part.layer.details[0] == f"library {tmp_path}/w/lib lies in a writable grant: noexec"
    assert part.mounts.directories == [f"{tmp_path}/lib"]
    assert part.mounts.noexec == [f"{tmp_path}/lib/sub"]  # a library directory's subdirectories are not code


# -- environment, network, syscalls, what is not covered, resources


def test_environment_passes_allowed_names_only(schemas: Any) -> None:
    policy = dataclasses.replace(
        policy_with(schemas, environment={"allowed_variables": ["LANG", "APP_*", "TOKEN"]}),
        secret_env=frozenset({"TOKEN", "UNSET"}),
    )
    environ = {"LANG": "C", "APP_A": "1", "TOKEN": "s3cret", "SSH_AUTH_SOCK": "/agent", "PATH": "/evil"}
    part = environment(policy, environ, "/usr/bin:/bin")
    assert part.env == {"APP_A": "1", "LANG": "C", "PATH": "/usr/bin:/bin", "TOKEN": "s3cret"}
    assert part.dropped == ["PATH", "SSH_AUTH_SOCK"] and part.secrets == ["s3cret"]
    assert part.layer.details == ["passed: APP_A, LANG, PATH, TOKEN", "dropped: PATH, SSH_AUTH_SOCK"]


def test_network_without_hosts_is_an_empty_namespace(schemas: Any) -> None:
    part = network(policy_with(schemas), ("nft",), None)
    assert part.egress is None and part.missing is None
    assert part.layer.mechanism == "new network namespace" and part.layer.details == ["loopback only: nothing leaves"]


def test_network_with_hosts_uses_the_filter_or_says_what_is_missing(schemas: Any) -> None:
    policy = policy_with(schemas, **NETWORK)
    settings = EgressValues(upstream_dns="192.0.2.53:5353", public_test_ranges=("198.51.100.0/24",))
    part = network(policy, (), settings)
    assert part.egress is settings and part.missing is None
    assert "hosts: api.example.test (other names: NXDOMAIN, never sent upstream)" in part.layer.details
    assert part.layer.details[-3:] == [
        "Landlock: no TCP listening; every TCP connect goes to the filter",
        "upstream resolver: 192.0.2.53:5353",
        "public test ranges (audited): 198.51.100.0/24",
    ]

    missing = network(policy, ("nft", "ip"), settings)
    assert missing.egress is None and missing.missing == "the egress filter needs nft, ip, not installed here"
    assert missing.layer.details == ["declared hosts api.example.test are NOT reachable: loopback only"]


def test_network_loads_egress_settings_through_the_loader_it_is_given(
    schemas: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = network(
        policy_with(schemas, **NETWORK), (), read_settings({"ADL_ENFORCER_UPSTREAM_DNS": "192.0.2.7:5300"}).egress
    )
    assert part.egress is not None and part.egress.resolver() == ("192.0.2.7", 5300)
    refused = read_settings({"ADL_ENFORCER_UPSTREAM_DNS": "not-an-address"}).egress
    with pytest.raises(PlanError, match=r"egress settings: upstream_dns \(ADL_ENFORCER_UPSTREAM_DNS\)"):
        network(policy_with(schemas, **NETWORK), (), refused)
    # None: the defaults; the process's environment is not read.
    monkeypatch.setenv("ADL_ENFORCER_UPSTREAM_DNS", "not-an-address")
    part = network(policy_with(schemas, **NETWORK), (), None)
    assert part.egress == EgressValues()


def test_syscalls_start_the_guard_for_what_it_must_check() -> None:
    plan, layer = syscalls(None)
    assert not plan.guard_creation and not plan.guard_metadata and layer.status == "active"
    writable_only = DeniedNames(PatternList.compile([], "path"), ("/w",))
    plan, _ = syscalls(writable_only)
    assert not plan.guard_creation and plan.guard_metadata
    plan, layer = syscalls(DeniedNames(PatternList.compile(["/w/**/.env"], "path"), ("/w",)))
    assert plan.guard_creation and plan.guard_metadata and layer.details


def test_residual_names_late_host_files_only_with_denied_paths(schemas: Any, tmp_path: Path) -> None:
    gaps, layer = residual(policy_with(schemas))
    assert layer.name == "not covered" and layer.status == "unavailable" and layer.details == gaps
    assert len(gaps) == 3 and gaps[0].startswith("name probing") and not any("late host files" in g for g in gaps)
    assert gaps[2].startswith("advisory locks")
    denied = {"allowed_paths": [{"path": f"{tmp_path}/**", "access": "read"}], "denied_paths": [f"{tmp_path}/k"]}
    gaps, _ = residual(policy_with(schemas, filesystem=denied))
    assert any(g.startswith("late host files") for g in gaps)


def test_resources_from_the_declared_limits(schemas: Any) -> None:
    limited = policy_with(
        schemas, resource_limits={"max_memory_mb": 256, "max_cpu_percent": 50, "max_duration_sec": 30}
    )
    part = resources(limited, "v2", 64)
    assert (part.limits.memory_bytes, part.limits.cpu_percent, part.limits.pids_max) == (256 << 20, 50, 64)
    assert part.timeout_s == 30 and part.missing is None
    assert part.layer.mechanism == "cgroup v2"
    assert part.layer.details == ["memory 256 MB, cpu 50%, pids 64, wall clock 30 s"]

    part = resources(policy_with(schemas), "none", 512)
    assert part.limits.memory_bytes is None and part.timeout_s is None
    assert part.missing == "no usable cgroup hierarchy (memory, cpu, pids)"
    assert part.layer.details == ["memory unlimited MB, cpu unlimited%, pids 512, wall clock unlimited s"]


def test_privileges_never_host_root() -> None:
    layer = privileges()
    assert layer.status == "active" and "never host root" in layer.mechanism
    assert any("uid or gid 0 refused" in d for d in layer.details)


def test_landlock_rules_keep_order_and_close_connect_without_the_filter(tmp_path: Path) -> None:
    tree(tmp_path, "f")
    grants = [(str(tmp_path), landlock.READ | landlock.WRITE), (f"{tmp_path}/f", landlock.READ | landlock.WRITE)]
    rules = landlock_rules(5, grants, via_filter=False)
    assert [path for path, _ in rules.rules] == [str(tmp_path), f"{tmp_path}/f"]
    assert rules.rules[1][1] & ~landlock.FILE_RIGHTS == 0  # a file takes file rights only
    assert rules.rules[0][1] & landlock.MAKE_DIR
    assert rules.deny_tcp_connect and rules.deny_tcp_bind
    filtered = landlock_rules(5, grants, via_filter=True)
    assert not filtered.deny_tcp_connect and filtered.deny_tcp_bind  # the filter decides and audits connects


# -- the composition


def test_build_plan_composes_the_layers_in_order(schemas: Any, tmp_path: Path) -> None:
    tool = program(tmp_path / "bin", "tool")
    tree(tmp_path, "w/.env", "w/ok")
    policy = policy_with(
        schemas,
        filesystem={
            "allowed_paths": [{"path": f"{tmp_path}/w/**", "access": "read_write"}],
            "denied_paths": [f"{tmp_path}/**/.env"],
        },
        **NETWORK,
    )
    plan = build_plan(
        policy,
        ["tool"],
        baseline=baseline_in(tmp_path),
        environ={"HOME": str(tmp_path)},
        features=HostFeatures(landlock_abi=6, cgroups="v2"),
        egress=EgressValues(upstream_dns="192.0.2.53:53"),
    )
    assert [layer.name for layer in plan.layers] == [
        "filesystem",
        "execution",
        "denied_paths",
        "environment",
        "network",
        "syscalls",
        "privileges",
        "not covered",
        "resources",
    ]
    assert plan.executable == str(tool) and plan.file_masks == [f"{tmp_path}/w/.env"]
    assert plan.landlock.rules == [
        (f"{tmp_path}/w", landlock.READ | landlock.WRITE),
        (str(tool), landlock.READ_FILE | landlock.EXECUTE),
    ]
    assert not plan.landlock.deny_tcp_connect and plan.egress is not None
    assert plan.creation_denied is not None and plan.seccomp.guard_creation and plan.seccomp.guard_metadata
    assert plan.residual == plan.layers[7].details and plan.refusals == [] and plan.accepted_unenforced == []


def test_build_plan_explained_on_a_bare_host_reports_every_gap_in_layer_order(schemas: Any, tmp_path: Path) -> None:
    program(tmp_path / "bin", "tool")
    plan = build_plan(
        policy_with(schemas, **NETWORK),
        ["tool"],
        baseline=baseline_in(tmp_path),
        environ={},
        features=HostFeatures(landlock_abi=0, cgroups="none", egress_tools_missing=("nft",)),
        explain_only=True,
    )
    statuses = {layer.name: layer.status for layer in plan.layers}
    assert [statuses[n] for n in ("filesystem", "execution", "network", "resources")] == ["unavailable"] * 4
    assert statuses["environment"] == statuses["syscalls"] == "active"
    assert [r.split(";")[1] for r in plan.refusals] == [
        f" refusing to run with '{domain}' unenforced (--accept-unenforced {domain} to accept)"
        for domain in ("filesystem", "execution", "network", "resources")
    ]
    assert plan.egress is None and plan.landlock.deny_tcp_connect

    with pytest.raises(PlanError, match=r"Landlock is not available.*'execution' unenforced"):
        build_plan(
            policy_with(schemas),
            ["tool"],
            baseline=baseline_in(tmp_path),
            environ={},
            features=HostFeatures(landlock_abi=0, cgroups="v2"),
            accept_unenforced=frozenset({"filesystem"}),
        )
