"""The Containerfile and the Kubernetes DaemonSet, checked without a container engine: the Containerfile
parses with BuildKit's own parser (the `dockerfile` package), its stages and sources hold together,
and both grant exactly the capabilities the systemd unit keeps, no more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"
DAEMONSET = REPO / "deploy" / "kubernetes" / "daemonset.yaml"
UNIT = REPO / "systemd" / "adl-enforcerd.service"

dockerfile = pytest.importorskip("dockerfile", reason="the dockerfile parser is a dev dependency")


def unit_capabilities() -> set[str]:
    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("CapabilityBoundingSet="))
    return {c.removeprefix("CAP_") for c in line.split("=", 1)[1].split()}


def test_containerfile_parses_and_its_stages_hold_together() -> None:
    commands = dockerfile.parse_file(str(CONTAINERFILE))
    froms = [c for c in commands if c.cmd == "FROM"]
    assert [c.value[-1] for c in froms] == ["build", "${PYTHON_IMAGE}"], froms
    stages = {"build"}
    for command in commands:
        if command.cmd == "COPY":
            source_stage = next((f.split("=", 1)[1] for f in command.flags if f.startswith("--from=")), None)
            if source_stage is None:
                assert command.value[:-1] == (".",), command.original
            else:
                assert source_stage in stages, command.original
    (entrypoint,) = [c for c in commands if c.cmd == "ENTRYPOINT"]
    assert entrypoint.json and entrypoint.value == ("adl-enforcerd",)
    runs = " ".join(" ".join(c.value) for c in commands if c.cmd == "RUN")
    for package in ("libseccomp2", "nftables"):
        assert package in runs
    assert "/opt/adl-enforcer/bin/pip install" in runs and "adl-enforcerd --version" in runs


def test_containerfile_grants_what_the_unit_keeps() -> None:
    text = CONTAINERFILE.read_text()
    (granted,) = re.findall(r"--cap-add=(\S+)", text)
    assert set(granted.split(",")) == unit_capabilities()
    assert "--cap-drop=all" in text


def test_daemonset_grants_what_the_unit_keeps() -> None:
    documents = list(YAML(typ="safe").load_all(DAEMONSET.read_text()))
    (daemonset,) = [d for d in documents if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == unit_capabilities()
    assert security["privileged"] is False and security["readOnlyRootFilesystem"] is True
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} == volumes
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/adl-enforcer/policies", "/run/adl-enforcer", "/var/log/adl-enforcer", "/sys/fs/cgroup"} <= mounts
    assert (
        daemonset["spec"]["selector"]["matchLabels"].items()
        <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    )


def test_build_context_leaves_out_the_local_environment() -> None:
    for name in (".containerignore", ".dockerignore"):
        ignored = (REPO / name).read_text().split()
        assert {".venv", ".git", "enforcer/v1", "policies/examples/keys"} <= set(ignored), name
