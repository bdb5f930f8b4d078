"""adl-exec --daemon's fast path: the command line read without argparse (enforcer/cli/daemon_args.py)
and the client that follows it (enforcer/cli/exec_daemon.py).

The fast path must either decline or do exactly what the argparse path does: the same request (agent,
argv, environ, cwd, accepted domains, pids limit) to the same address, the same session file, the
same report, messages and exit codes. Checked over generated command lines against the argparse
path with only the socket replaced, then end to end against a scripted launch socket.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enforcer import sandbox
from enforcer.cli import daemon_args, exec_daemon
from enforcer.cli import exec as exec_cli
from enforcer.sandbox import stage
from enforcer.v1 import enforcer_pb2 as pb
from tests.helpers.budgets import examples
from tests.helpers.launch_socket import ScriptedDaemon

# ---- the command line: the fast reader agrees with argparse -----------------------------------------------

OPTIONS = ["--daemon", "--agent", "--session-file", "--accept-unenforced", "--pids-max", "--report", "--json"]
OTHERS = ["--aaif", "--user", "--explain", "--learn", "--help", "-h", "--version", "--production", "--regions"]
OTHERS += ["--audit-dir", "--audit-key", "--baseline", "--ag", "--rep", "--da", "--j", "--accept", "--pids"]
OTHERS += ["--session", "--", "-", "", "-x", "--nope"]
VALUES = ["unix:/run/x.sock", "unix:", "tcp:127.0.0.1:1", "A", "Coding Agent", "-x", "-5", "5", "0", "512"]
VALUES += ["4294967295", "4294967296", "0012", "+5", " 7", "１２", "1_0", *sandbox.DOMAINS, "nope", "s.json"]
VALUES += ["./s.json", "a//b", "/tmp/x/", "/tmp/s.json", ".", "..", "-a b", "//x", "x/./y", "=", "--"]
ADDRESSES = [None, "unix:/env.sock", "", "tcp:x", "-x"]

token = st.one_of(
    st.sampled_from(OPTIONS),
    st.sampled_from(OTHERS),
    st.sampled_from(VALUES),
    st.builds(
        lambda o, v: f"{o}={v}", st.sampled_from(OPTIONS + OTHERS), st.sampled_from(VALUES) | st.text(max_size=4)
    ),
    st.text(max_size=5),
)


# Mostly close to a launch, so that both outcomes are common: each option that goes with --daemon
# (or none), and maybe a stray token, in a shuffled order, spelled "--opt value" or "--opt=value".
def _option(name: str, usual: list[str], required: bool = False) -> st.SearchStrategy[list[str]]:
    values = st.sampled_from(usual * (len(VALUES) // len(usual) * 3) + VALUES)
    spelled = [st.builds(lambda v: [name, v], values), st.builds(lambda v: [f"{name}={v}"], values)]
    return st.one_of(*spelled) if required else st.one_of(st.just([]), *spelled)


launch_like = st.builds(
    lambda options, dash, command: [arg for option in options for arg in option] + dash + command,
    st.tuples(
        _option("--daemon", ["unix:/a.sock", "unix:/b c", "unix:"]),
        _option("--agent", ["A", "B C", "é"], required=True),
        _option("--session-file", ["s.json", "/tmp/s", "./s", "a//b", "a/", "/./a", "../a", "//a"]),
        _option("--pids-max", ["0", "7", "0012", "4294967295", "4294967296", "+5", "１２"]),
        _option("--accept-unenforced", list(sandbox.DOMAINS)),
        _option("--accept-unenforced", list(sandbox.DOMAINS)),
        st.sampled_from([[], ["--report"], ["--json"], ["--report", "--json"]]),
        st.one_of(*[st.just([])] * 3, token.map(lambda t: [t])),
    ).flatmap(st.permutations),
    st.sampled_from([[], ["--"]]),
    st.lists(st.sampled_from(["true", *VALUES, *OPTIONS]) | st.text(max_size=4), min_size=1, max_size=3),
)


@contextlib.contextmanager
def daemon_address(value: str | None) -> Iterator[None]:
    """$ADL_ENFORCER_ADDR set to value, or unset (the parser takes its default when it is built)."""
    with mock.patch.dict(os.environ):
        os.environ.pop("ADL_ENFORCER_ADDR", None)
        if value is not None:
            os.environ["ADL_ENFORCER_ADDR"] = value
        yield


def what_is_sent(argv: list[str], fast: bool) -> tuple[Any, ...] | None:
    """What reaches the socket code for argv by one path (exec_daemon.launch's arguments, the request
    decoded by the daemon's own classes), or None when that path sends nothing."""
    sent: list[tuple[Any, ...]] = []

    def launch(address: str, request: bytes, session_file: Any, report: bool, as_json: bool) -> int:
        sent.append(
            (address, pb.LaunchRequest.FromString(request), session_file and str(session_file), report, as_json)
        )
        return 0

    with (
        mock.patch.object(exec_daemon, "launch", launch),
        mock.patch.object(stage, "prepare", side_effect=AssertionError("an embedded launch was started")),
    ):
        if fast:
            read = daemon_args.read(argv, os.environ)
            if read is None:
                return None
            assert exec_daemon.fast_launch(read, os.environ) == 0
        else:
            with (
                mock.patch.object(daemon_args, "read", lambda *_: None),
                contextlib.redirect_stderr(io.StringIO()),
                contextlib.redirect_stdout(io.StringIO()),
            ):
                try:
                    assert exec_cli.main(argv) == 0
                except SystemExit:
                    return None
    assert len(sent) == 1
    return sent[0]


@settings(max_examples=examples(3000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(launch_like, st.lists(token, max_size=8)), st.sampled_from(ADDRESSES))
def test_the_fast_reader_declines_or_reads_what_argparse_reads(argv: list[str], address: str | None) -> None:
    if any(arg.startswith("--ad") for arg in argv):
        return  # --adl (or its abbreviation) reads a document: not a fast launch, and not this test's
    with daemon_address(address):
        fast = what_is_sent(argv, fast=True)
        if fast is not None:
            assert what_is_sent(argv, fast=False) == fast, argv


@pytest.mark.parametrize(
    "argv",
    [
        ["--daemon", "unix:/s", "--agent", "A", "--", "true"],
        ["--daemon=unix:/s", "--agent=A", "--report", "--json", "true", "--report"],
        ["--agent", "A", "--session-file", "/tmp/s.json", "--pids-max", "7", "--", "true"],
        ["--agent", "A", "--accept-unenforced", "network", "--accept-unenforced=resources", "--", "true"],
        ["--agent", "A", "--", ""],
    ],
)
def test_the_usual_launches_take_the_fast_path(argv: list[str]) -> None:
    """Control for the property above: these are read, and read as argparse reads them."""
    with daemon_address("unix:/env.sock"):
        fast = what_is_sent(argv, fast=True)
        assert fast is not None and what_is_sent(argv, fast=False) == fast


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["--ag", "A", "--", "true"],  # an abbreviation argparse accepts
        ["--agent", "A", "--agent", "B", "--", "true"],  # repeated: argparse keeps the last
        ["--report", "--report", "--agent", "A", "--", "true"],
        ["--report=1", "--agent", "A", "--", "true"],
        ["--agent", "-A", "--", "true"],
        ["--agent", "", "--", "true"],
        ["--agent", "A", "--"],  # no command
        ["--agent", "A", "--explain", "--", "true"],
        ["--agent", "A", "--learn", "x.json", "--", "true"],
        ["--agent", "A", "--user", "nobody", "--", "true"],
        ["--agent", "A", "--pids-max", "+5", "--", "true"],
        ["--agent", "A", "--pids-max", "4294967296", "--", "true"],
        ["--agent", "A", "--pids-max", "1" * 5000, "--", "true"],
        ["--agent", "A", "--accept-unenforced", "nope", "--", "true"],
        ["--agent", "A", "--session-file", "./s.json", "--", "true"],  # pathlib prints it as s.json
        ["--agent", "A", "--session-file", "", "--", "true"],
        ["--daemon", "tcp:1", "--agent", "A", "--", "true"],
        ["--agent", "A", "-x", "true"],
        ["--agent=--", "true"],  # argparse reads the value "--" as no value
        ["--agent", "A", "true", "--=x"],  # after a command without "--", argparse refuses "--=x"
        ["--agent", "A", "true", "--ag=B"],  # ... and reads "--ag=B" as an option first
    ],
)
def test_anything_else_is_left_to_argparse(argv: list[str]) -> None:
    with daemon_address("unix:/env.sock"):
        assert daemon_args.read(argv, os.environ) is None


def test_without_an_address_it_is_no_daemon_launch() -> None:
    assert daemon_args.read(["--agent", "A", "--", "true"], {}) is None
    assert daemon_args.read(["--agent", "A", "--", "true"], {"ADL_ENFORCER_ADDR": ""}) is None
    read = daemon_args.read(["--agent", "A", "--", "true"], {"ADL_ENFORCER_ADDR": "unix:/e"})
    assert read is not None and read.address == "unix:/e"


def test_its_constants_are_the_parsers() -> None:
    assert daemon_args.DOMAINS == sandbox.DOMAINS
    assert exec_cli.build_parser().get_default("pids_max") == daemon_args.DEFAULT_PIDS_MAX


def test_a_request_that_cannot_be_encoded_is_declined_before_anything_is_opened(tmp_path: Path) -> None:
    """Strings that are not valid Unicode (argv, environ): declined, the session file not created,
    so that argparse's path reports them as it always has."""
    session_file = tmp_path / "session.json"
    for argv, environ in [(["\udcff"], {}), (["true"], {"X": "\udcff"})]:
        options = ["--daemon", "unix:/x", "--agent", "A", "--session-file", str(session_file)]
        read = daemon_args.read([*options, "--", *argv], environ)
        assert read is not None
        with mock.patch.object(exec_daemon, "launch", side_effect=AssertionError("launched")):
            assert exec_daemon.fast_launch(read, environ) is None
    assert not session_file.exists()


def test_session_file_text_is_what_json_writes() -> None:
    for session, token in [("s-1", "t0k3n"), ('q"uote', "back\\slash"), ("é", "\x7f\n\t"), ("", "🙂")]:
        reply = exec_daemon.LaunchReply(accepted=True, session=session, session_token=token)
        expected = json.dumps({"session": session, "session_token": token})
        assert exec_daemon.session_file_text(reply) == expected


# ---- end to end: the same socket traffic, files and messages by both paths ---------------------------------


ACCEPTED = pb.LaunchReply(accepted=True, session="s-1", session_token="tok").SerializeToString()
DENIAL = {"count": 1, "access": "fs.read_file", "path": "/etc/shadow\x1b[2J\nforged", "command": "cat", "hint": "no"}
DENIALS = {"available": True, "landlock": 7, "denials": 1, "recorded": 1, "top": [DENIAL]}
SCRIPTS: dict[str, list[bytes | None]] = {
    "exit code": [ACCEPTED, pb.SessionEnded(session="s-1", reason="exit", exit_code=3).SerializeToString()],
    "signal and denials": [
        ACCEPTED,
        pb.SessionEnded(
            session="s-1",
            reason="signal",
            exit_code=137,
            signal=9,
            duration_ms=12,
            creations_refused=2,
            kernel_denials_json=json.dumps(DENIALS),
        ).SerializeToString(),
    ],
    "refused": [pb.LaunchReply(accepted=False, refusal="not yours").SerializeToString()],
    "refused at start": [ACCEPTED, pb.SessionEnded(reason="refused", detail="no landlock").SerializeToString()],
    "malformed reply": [b"\x08"],
    "malformed end": [ACCEPTED, b"\x12\x05abc"],
    "no answer": [None],
    "lost contact": [ACCEPTED, None],
}


def run_client(tmp: Path, answers: list[bytes | None] | None, options: list[str], fast: bool) -> dict[str, Any]:
    daemon = ScriptedDaemon(tmp, answers) if answers is not None else None
    address = f"unix:{daemon.path if daemon else tmp / 'nobody-listens.sock'}"
    argv = ["--daemon", address, "--agent", "A", *options, "--", "true", "x y"]
    stderr = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stderr(stderr))
        if fast:  # and not through argparse
            stack.enter_context(mock.patch.object(exec_cli, "build_parser", side_effect=AssertionError("argparse")))
        else:
            stack.enter_context(mock.patch.object(daemon_args, "read", lambda *_: None))
        try:
            code = exec_cli.main(argv)
        finally:
            if daemon:
                daemon.close()
    return {
        "code": code,
        "stderr": stderr.getvalue().replace(str(tmp), "TMP"),
        "request": daemon.request.SerializeToString(deterministic=True) if daemon and daemon.request else None,
        "fds": [(info.st_dev, info.st_ino) for info in daemon.received] if daemon else None,
    }


@pytest.mark.parametrize("options", [[], ["--report"], ["--report", "--json"]])
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_both_paths_talk_and_answer_alike(tmp_path: Path, script: str, options: list[str]) -> None:
    fast = run_client(tmp_path, SCRIPTS[script], options, fast=True)
    assert fast == run_client(tmp_path, SCRIPTS[script], options, fast=False)
    request = pb.LaunchRequest.FromString(fast["request"])
    assert list(request.argv) == ["true", "x y"] and request.agent == "A" and request.cwd == os.getcwd()
    assert dict(request.environ) == dict(os.environ) and request.pids_max == daemon_args.DEFAULT_PIDS_MAX
    assert fast["fds"] == [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (0, 1, 2)]  # our stdio
    assert fast["code"] == {"exit code": 3, "signal and denials": 137}.get(script, 125)
    if script == "signal and denials" and options == ["--report"]:
        assert "s-1 ended: signal (exit code 137, signal 9, 2 denied name(s) not created, 12 ms)" in fast["stderr"]
        assert "/etc/shadow\\x1b[2J\\nforged by cat" in fast["stderr"]  # the agent's name, escaped
        assert "\x1b" not in fast["stderr"] and "\nforged" not in fast["stderr"]
    if script == "refused":
        assert fast["stderr"] == "adl-exec: refused: not yours\n"


def test_an_unreachable_daemon_is_refused_alike(tmp_path: Path) -> None:
    fast = run_client(tmp_path, None, [], fast=True)
    assert fast == run_client(tmp_path, None, [], fast=False)
    assert fast["code"] == 125 and "cannot reach adl-enforcerd at unix:TMP/nobody-listens.sock" in fast["stderr"]


def test_the_session_file_is_written_alike(tmp_path: Path) -> None:
    written = []
    for fast in (True, False):
        session_file = tmp_path / f"session-{fast}.json"
        result = run_client(tmp_path, SCRIPTS["exit code"], ["--session-file", str(session_file)], fast)
        assert result["code"] == 3
        assert stat.S_IMODE(session_file.stat().st_mode) == 0o600
        written.append(session_file.read_text())
    assert written[0] == written[1] == json.dumps({"session": "s-1", "session_token": "tok"})
    # A path that cannot be written refuses the launch before anything is sent, by both paths.
    unwritable = ["--session-file", str(tmp_path / "no" / "such" / "dir.json")]
    fast = run_client(tmp_path, None, unwritable, fast=True)
    assert fast == run_client(tmp_path, None, unwritable, fast=False)
    assert fast["code"] == 125 and "--session-file TMP/no/such/dir.json: No such file or directory" in fast["stderr"]


def fast_launch_imports(tmp_path: Path, script: str, options: list[str]) -> tuple[int, set[str]]:
    """(exit code, modules loaded beyond the interpreter's start-up) of a --daemon launch in a fresh
    interpreter against a scripted launch socket."""
    daemon = ScriptedDaemon(tmp_path, SCRIPTS[script])
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from enforcer.cli import exec\n"
        f"code = exec.main(['--daemon', 'unix:{daemon.path}', '--agent', 'A', *{options!r}, '--', 'true'])\n"
        "loaded = sorted(set(sys.modules) - before)\n"
        "import json\n"
        "print(code, json.dumps(loaded))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADL_ENFORCER_ADDR"}
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    finally:
        daemon.close()
    code, loaded = out.stdout.split(" ", 1)
    return int(code), set(json.loads(loaded))


CLIENT = {"enforcer", "enforcer.cli", "enforcer.cli.exec", "enforcer.cli.daemon_args", "enforcer.cli.exec_daemon"}
CLIENT |= {"enforcer.cli.exec_common", "enforcer.cli.launch_messages", "enforcer.framing", "_socket"}


def test_a_fast_launch_imports_only_its_client(tmp_path: Path) -> None:
    """What a --daemon launch loads beyond the interpreter's start-up: the client's own modules and
    _socket; not argparse, socket, json, struct, typing, dataclasses, the settings or the sandbox."""
    code, loaded = fast_launch_imports(tmp_path, "exit code", ["--report"])
    assert code == 3
    assert loaded <= CLIENT


def test_a_report_of_kernel_denials_imports_no_audit_or_policy_code(tmp_path: Path) -> None:
    """--report with the kernel denials' summary: its lines and json, not the audit package (its
    writer and cryptography) or the policy code that the session's denial reader needs."""
    code, loaded = fast_launch_imports(tmp_path, "signal and denials", ["--report"])
    assert code == 137
    ours = {m for m in loaded if m.split(".")[0] == "enforcer"}
    assert ours <= CLIENT | {"enforcer.sandbox", "enforcer.sandbox.denial_report", "enforcer.text"}
    heavy = ("argparse", "socket", "dataclasses", "typing", "cryptography", "orjson", "pydantic", "google")
    assert not {m for m in loaded if m.split(".")[0] in heavy}


def refusal_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str]:
    try:
        code: int | str | None = exec_cli.main(argv)
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def test_text_that_is_not_utf8_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The launch socket's strings are UTF-8: undecodable bytes in the command, the environment or
    the agent's name are refused (exit 125) and named, before the session file is opened or the
    daemon reached; neither dropped nor altered."""
    session_file = tmp_path / "session.json"
    launch = ["--daemon", f"unix:{tmp_path / 'nobody.sock'}", "--session-file", str(session_file)]
    cases = [
        (["--agent", "A", "--", "cat", "\udcff"], {}, "argument 1 of the command is not valid UTF-8"),
        (
            ["--agent", "A", "--", "true"],
            {"ADL_TEST_BYTES": "x\udcff"},
            "environment variable 'ADL_TEST_BYTES' is not valid UTF-8",
        ),
        (["--agent", "\udcffA", "--", "true"], {}, "the agent's name is not valid UTF-8"),
    ]
    for argv, extra, message in cases:
        with mock.patch.dict(os.environ, extra):
            code, err = refusal_of([*launch, *argv], capsys)
        assert code == 125 and err == f"adl-exec: refused: {message} (the daemon takes UTF-8 text only)\n"
    assert not session_file.exists()


def test_a_lost_working_directory_and_an_unsendable_pids_limit_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launch = ["--daemon", f"unix:{tmp_path / 'nobody.sock'}", "--agent", "A"]
    gone = FileNotFoundError(2, "No such file or directory")
    with mock.patch.object(os, "getcwd", side_effect=gone):
        code, err = refusal_of([*launch, "--", "true"], capsys)
    assert code == 125 and err == "adl-exec: refused: the working directory: No such file or directory\n"
    for limit in ("-1", "4294967296"):
        code, err = refusal_of([*launch, f"--pids-max={limit}", "--", "true"], capsys)
        assert code == 2 and f"--pids-max {limit}: expected 0 to 4294967295" in err
