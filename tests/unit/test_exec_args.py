"""An embedded launch's command line read without argparse (enforcer/cli/exec_args.py): read()
declines, or reads exactly what adl-exec's argparse parser reads, over generated command lines."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enforcer import sandbox
from enforcer.cli import exec as exec_cli
from enforcer.cli import exec_args
from tests.helpers.budgets import examples

OPTIONS = ["--adl", "--aaif", "--regions", "--baseline", "--audit-dir", "--audit-key", "--user", "--pids-max"]
OPTIONS += ["--accept-unenforced", "--report", "--json", "--production"]
OTHERS = ["--explain", "--learn", "--help", "-h", "--version", "--daemon", "--agent", "--session-file"]
OTHERS += ["--ad", "--rep", "--j", "--accept", "--pids", "--user-x", "--", "-", "", "-x", "--nope", "-5"]
VALUES = ["a.adl.json", "/tmp/a.json", "./a", "a//b", "a/", "/./a", "../a", "//a", ".", "", "=", "--", "-x"]
VALUES += ["nobody", "65534:65534", "0", "7", "0012", "-5", "+5", " 7", "1_0", "１２", "4294967296", "x"]
VALUES += [*sandbox.DOMAINS, "nope", "a b", "é"]

token = st.one_of(
    st.sampled_from(OPTIONS),
    st.sampled_from(OTHERS),
    st.sampled_from(VALUES),
    st.builds(
        lambda o, v: f"{o}={v}", st.sampled_from(OPTIONS + OTHERS), st.sampled_from(VALUES) | st.text(max_size=4)
    ),
    st.text(max_size=5),
)


def _option(name: str, usual: list[str], required: bool = False) -> st.SearchStrategy[list[str]]:
    values = st.sampled_from(usual * (len(VALUES) // len(usual) * 3) + VALUES)
    spelled = [st.builds(lambda v: [name, v], values), st.builds(lambda v: [f"{name}={v}"], values)]
    return st.one_of(*spelled) if required else st.one_of(st.just([]), *spelled)


# Mostly close to a launch, so that both outcomes are common.
launch_like = st.builds(
    lambda options, dash, command: [arg for option in options for arg in option] + dash + command,
    st.tuples(
        _option("--adl", ["a.adl.json", "/p/a.json", "a//b/"], required=True),
        _option("--aaif", ["a.aaif.json"]),
        _option("--regions", ["r.yaml"]),
        _option("--baseline", ["b.yaml"]),
        _option("--audit-dir", ["/var/log/x", "a"]),
        _option("--audit-key", ["k.pem"]),
        _option("--user", ["nobody", "65534:65534", "1000"]),
        _option("--pids-max", ["0", "7", "0012", "+5", "１２", "1_0", " 7", "x"]),
        _option("--accept-unenforced", list(sandbox.DOMAINS)),
        _option("--accept-unenforced", list(sandbox.DOMAINS)),
        st.sampled_from([[], ["--report"], ["--json"], ["--production"], ["--report", "--json"]]),
        st.one_of(*[st.just([])] * 3, token.map(lambda t: [t])),
    ).flatmap(st.permutations),
    st.sampled_from([[], ["--"]]),
    st.lists(st.sampled_from(["true", *VALUES, *OPTIONS]) | st.text(max_size=4), min_size=1, max_size=3),
)

ATTRIBUTES = (
    "adl", "aaif", "regions", "baseline", "audit_dir", "audit_key", "report", "json", "production", "user",
    "pids_max", "accept_unenforced", "explain", "learn", "daemon", "agent", "session_file",
)  # fmt: skip


def argparse_reads(argv: list[str]) -> dict[str, Any] | None:
    """What adl-exec's parser reads (with the command as adl-exec takes it), None if it refuses."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            namespace = exec_cli.build_parser().parse_args(argv)
        except SystemExit:
            return None
    read = {name: getattr(namespace, name) for name in ATTRIBUTES}
    read["command"] = namespace.command[1:] if namespace.command[:1] == ["--"] else namespace.command
    return read


@pytest.fixture(autouse=True)
def _no_daemon_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADL_ENFORCER_ADDR", raising=False)  # --daemon's default, when the parser is built


@settings(max_examples=examples(3000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(launch_like, st.lists(token, max_size=8)))
def test_read_declines_or_reads_what_argparse_reads(argv: list[str]) -> None:
    fast = exec_args.read(argv, os.environ)
    if fast is None:
        return
    assert fast.command  # a launch has a command
    assert {**{name: getattr(fast, name) for name in ATTRIBUTES}, "command": fast.command} == argparse_reads(argv), argv


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--adl", "a.json", "--", "true"], {"adl": Path("a.json"), "command": ["true"]}),
        (["--adl=a//b/", "true", "--report"], {"adl": Path("a/b"), "command": ["true", "--report"]}),
        (
            ["--user", "nobody", "--adl", "a", "--pids-max", "0012", "--accept-unenforced", "network", "--",
             "--", "x"],
            {"adl": Path("a"), "user": "nobody", "pids_max": 12, "accept_unenforced": ["network"],
             "command": ["--", "x"]},
        ),
        (
            ["--adl", "a", "--report", "--json", "--production", "--aaif", "f", "--audit-dir", "d", "--", "c"],
            {"adl": Path("a"), "report": True, "json": True, "production": True, "aaif": Path("f"),
             "audit_dir": Path("d"), "command": ["c"]},
        ),
    ],
)  # fmt: skip
def test_read_accepts_plain_launches(argv: list[str], expected: dict[str, Any]) -> None:
    fast = exec_args.read(argv, os.environ)
    assert fast is not None
    assert {name: getattr(fast, name) for name in expected} == expected
    assert {**{name: getattr(fast, name) for name in ATTRIBUTES}, "command": fast.command} == argparse_reads(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--adl", "a", "--explain", "--", "true"],  # --explain prints and runs nothing: argparse's
        ["--adl", "a", "--learn", "o.json", "--", "true"],
        ["--adl", "a", "--daemon", "unix:/x", "--", "true"],
        ["--ad", "a", "--", "true"],  # an abbreviation
        ["--adl", "a", "--adl", "b", "--", "true"],  # a repeat
        ["--adl", "a", "--report", "--report", "--", "true"],
        ["--adl", "a", "--report=1", "--", "true"],
        ["--adl", "-a", "--", "true"],  # a value starting with "-"
        ["--adl=--", "--", "true"],
        ["--adl", "a", "--pids-max", "x", "--", "true"],  # argparse refuses it, with its message
        ["--adl", "a", "--accept-unenforced", "nope", "--", "true"],
        ["--adl", "a", "--"],  # no command
        ["--adl", "a", "true", "--=x"],  # after a command without "--", argparse refuses "--=x"
        ["--adl", "a"],
        ["--", "true"],  # no --adl
        ["--help"],
        ["--version"],
    ],
)
def test_read_declines(argv: list[str]) -> None:
    assert exec_args.read(argv, os.environ) is None


def test_read_declines_when_the_daemon_address_is_set() -> None:
    argv = ["--adl", "a", "--", "true"]
    assert exec_args.read(argv, {"ADL_ENFORCER_ADDR": "unix:/run/x.sock"}) is None
    assert exec_args.read(argv, {"ADL_ENFORCER_ADDR": ""}) is not None  # empty: no daemon (argparse's falsy default)
