"""README.md is an entry point: short, the two commands first, every command in it run by the demo
or a named test, and every link it or docs/ makes into the repository leads to a file that exists."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 180
    assert lines[2:6] == [
        "```sh",
        "./scripts/demo.sh     # set up, launch an example agent under its policy: allowed and denied actions,"
        " audit trail",
        "./scripts/test.sh     # set up, then run lint and the whole test suite (needs ../shared/spec)",
        "```",
    ]


def test_links_in_the_readme_and_docs_lead_to_files_in_the_repository() -> None:
    broken = []
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            assert "://" not in target, f"{page.name}: a link outside the repository: {target}"
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


# Every command in README.md's shell blocks and where it runs: the demo (scripts/demo.sh, with the
# scripts it calls), or a test, given as "path::function" places whose source holds the command's
# program, subcommand, options and environment variables (tokens()); the first place is the test,
# the others the helpers or fixtures it runs the command through. A new command must be added here.
DEMO = ("scripts/demo.sh",)
RUN_BY: dict[str, tuple[str, ...]] = {
    "./scripts/test.sh": (".ci/run",),  # the test command itself: CI runs it
    "adl-exec --learn agent.adl.json --adl start.adl.json -- python3 agent.py": (
        "tests/integration/test_learn.py::test_learn_then_run_clean_then_one_grant_less_is_exactly_one_denial",
        "tests/helpers/sandbox.py::Sandbox.run",
        "tests/helpers/sandbox.py::Sandbox.exec_argv",
    ),
    "adl-exec --adl agent.adl.json --report -- python3 agent.py": DEMO,
    "adl-audit search --decision deny --since -10m": (
        "tests/unit/test_audit_query.py::test_search_filters_and_or",
        "tests/unit/test_audit_query.py::test_search_seq_time_json_limit_reverse",
    ),
    "adl-exec --adl agent.adl.json --explain -- python3 agent.py": DEMO,
    "python3 -m venv /opt/adl-enforcer": (
        "tests/install/test_wheel.py::test_the_package_is_the_installed_one",
        "tests/install/test_wheel.py::venv",
    ),
    "/opt/adl-enforcer/bin/pip install dist/adl_enforcer-0.1.0-py3-none-any.whl": (
        "tests/install/test_wheel.py::test_the_package_is_the_installed_one",
        "tests/install/test_wheel.py::venv",
    ),
    "/opt/adl-enforcer/bin/adl-enforcerd install-systemd": (
        "tests/install/test_systemd_install.py::test_files_are_written_below_the_root",
        "tests/install/test_systemd_install.py::install",
    ),
    "systemd-sysusers /etc/sysusers.d/adl-enforcer.conf": (
        "tests/install/test_systemd_install.py::test_sysusers_and_tmpfiles_apply_below_the_root",
    ),
    "systemd-tmpfiles --create /etc/tmpfiles.d/adl-enforcer.conf": (
        "tests/install/test_systemd_install.py::test_sysusers_and_tmpfiles_apply_below_the_root",
    ),
    "systemctl daemon-reload": (
        "tests/install/test_systemd_boot.py::test_daemon_reload_and_enable_now_as_the_readme_installs",
    ),
    "systemctl enable --now adl-enforcerd": (
        "tests/install/test_systemd_boot.py::test_daemon_reload_and_enable_now_as_the_readme_installs",
    ),
    "adl-exec --adl AGENT.adl.json --user agent [--aaif AGENT.aaif.json] -- COMMAND ARGS...": (
        "tests/integration/test_policy_agreement.py::"
        "test_a_regulated_agent_needing_an_unprovided_capability_is_refused_and_audited",
        "tests/helpers/sandbox.py::Sandbox.run",
        "tests/helpers/sandbox.py::Sandbox.exec_argv",
    ),
    "adl-exec --adl AGENT.adl.json --explain -- COMMAND": DEMO,
    "ADL_ENFORCER_POLICY_DIR=policies/examples adl-enforcerd": (
        "tests/integration/test_daemon.py::test_check_allow_deny_ask_with_reasons_and_audit_receipts",
        "tests/helpers/daemon.py::RunningDaemon.env",
        "tests/helpers/daemon.py::RunningDaemon.__init__",
    ),
    'adl-exec --daemon unix:/run/adl-enforcer/launch.sock --agent "Coding Agent" -- python3 agent.py': (
        "tests/install/test_systemd_boot.py::test_session_runs_in_the_delegated_cgroup_and_stop_records_its_exit",
    ),
    "adl-approve list": (
        "tests/integration/test_approve_cli.py::test_list_show_approve_and_reject_real_pending_checks",
    ),
    "adl-approve approve ID --as NAME": (
        "tests/integration/test_approve_cli.py::test_list_show_approve_and_reject_real_pending_checks",
    ),
    "adl-audit search --decision deny --since -1h": (
        "tests/unit/test_audit_query.py::test_search_filters_and_or",
        "tests/unit/test_audit_query.py::test_search_seq_time_json_limit_reverse",
    ),
    "adl-audit verify [--public-key KEY.pub.pem]": (
        "tests/unit/test_audit_log.py::test_chain_is_gap_free_and_sealed",
        "tests/helpers/audit_logs.py::verify_cli",
    ),
    "adl-policy validate FILE...": ("tests/unit/test_cli_policy.py::test_validate_examples_ok",),
    "adl-policy check ADL --tool NAME --args JSON": ("tests/unit/test_cli_policy.py::test_check_exit_codes",),
    'adl-mcp --agent "Coding Agent" -- python3 my_server.py': (
        "tests/integration/test_mcp_gateway.py::test_gateway_lists_declared_tools_checks_every_call_and_audits",
        "tests/integration/test_mcp_gateway.py::_gateway_params",
    ),
}
# Shell steps of the quick start that run no program of ours or of the system's set-up; the document
# the heredoc writes is checked by test_the_readme_quickstart_document_is_valid.
SHELL_STEPS = {"./scripts/demo.sh", "cd my-agent", "cat > start.adl.json <<'JSON'"}
SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
HEREDOC = re.compile(r"<<-?'?(\w+)'?")
# An interpreter a test runs as itself rather than by name.
ALIASES = {"python3": ("python3", "sys.executable")}


def readme_commands() -> list[str]:
    """Each command of README.md's sh blocks: comments and heredoc bodies left out, lines split at ; && ||."""
    commands = []
    for block in SHELL_BLOCK.findall(README.read_text()):
        heredoc = None
        for line in block.splitlines():
            if heredoc is not None:
                heredoc = None if line.strip() == heredoc else heredoc
                continue
            if found := HEREDOC.search(line):
                heredoc = found.group(1)
            code = re.sub(r"(^|\s)#.*$", "", line).strip()
            commands += [part for part in re.split(r"\s*(?:;|&&|\|\|)\s*", code) if part]
    return commands


def tokens(command: str) -> tuple[str, list[str]]:
    """The program a command runs and the words a place that runs it must hold: its environment
    variables, its subcommand (a first positional word such as `search`) and its options."""
    words = [w.strip("[]") for w in shlex.split(command)]
    env = [w.split("=", 1)[0] for w in words if re.fullmatch(r"[A-Z_]+=.*", w)]
    words = words[len(env) :]
    program, rest = Path(words[0]).name, words[1:]
    end = rest.index("--") if "--" in rest else len(rest)
    options = [w.split("=", 1)[0] for w in rest[:end] if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", w)]
    positional = [w for w in rest[:end] if not w.startswith("-")]
    subcommand = [positional[0]] if positional and re.fullmatch(r"[a-z][a-z-]*", positional[0]) else []
    return program, env + subcommand + options


def source_of(place: str) -> tuple[str, str]:
    """(the whole file, the named function's source) for "path::qualname"; a bare path names a script."""
    path, _, qualname = place.partition("::")
    text = (REPO / path).read_text()
    if not qualname:
        return text, text
    scope: list[ast.stmt] = ast.parse(text).body
    node: ast.AST | None = None
    for name in qualname.split("."):
        node = next((n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None)
        assert node is not None, f"{place}: no {name}"
        scope = node.body  # type: ignore[attr-defined]
    assert isinstance(node, ast.FunctionDef | ast.ClassDef)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])  # parametrize holds arguments too
    return text, "\n".join(text.splitlines()[first - 1 : node.end_lineno])


def program_names(program: str) -> tuple[str, ...]:
    """How a source may name a program: itself, or for this package's commands their entry module."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    if program in scripts:
        module = scripts[program].split(":")[0]
        package, _, name = module.rpartition(".")
        return program, module, f"from {package} import {name}"
    return ALIASES.get(program, (program,))


def holds(source: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", source) is not None


def test_every_readme_command_is_run_by_the_demo_or_a_named_test() -> None:
    commands = readme_commands()
    unlisted = [c for c in commands if c not in RUN_BY and c not in SHELL_STEPS]
    assert not unlisted, f"README.md commands no test or demo runs (add them to RUN_BY): {unlisted}"
    stale = [c for c in RUN_BY if c not in commands]
    assert not stale, f"RUN_BY names commands README.md no longer has: {stale}"
    demo = "\n".join((REPO / p).read_text() for p in ("scripts/demo.sh", "scripts/demo_network.py"))
    missing = []
    for command, places in RUN_BY.items():
        program, words = tokens(command)
        if places == DEMO:
            files, functions = demo, demo
        else:
            assert places[0].partition("::")[2].split(".")[-1].startswith("test_") or "::" not in places[0], places
            sources = [source_of(place) for place in places]
            files, functions = "\n".join(s[0] for s in sources), "\n".join(s[1] for s in sources)
        if not any(name in files for name in program_names(program)):
            missing.append(f"{command}: {places[0]} does not name {program}")
        missing += [f"{command}: {places[0]} lacks {w}" for w in words if not holds(functions, w)]
    assert not missing, missing


def test_readme_command_tokens_are_what_the_check_looks_for() -> None:
    assert tokens("ADL_ENFORCER_POLICY_DIR=policies/examples adl-enforcerd") == (
        "adl-enforcerd",
        ["ADL_ENFORCER_POLICY_DIR"],
    )
    assert tokens("adl-audit search --decision deny --since -10m") == ("adl-audit", ["search", "--decision", "--since"])
    assert tokens("adl-exec --adl A.json [--aaif B.json] -- python3 -m x") == ("adl-exec", ["--adl", "--aaif"])
    assert tokens("/opt/v/bin/pip install dist/x.whl") == ("pip", ["install"])
    assert "adl-audit verify [--public-key KEY.pub.pem]" in readme_commands()
    assert "ADL_ENFORCER_POLICY_DIR=policies/examples adl-enforcerd" in readme_commands()
    assert not [c for c in readme_commands() if c.startswith("{") or c == "JSON"]  # heredoc bodies left out


def test_the_readme_quickstart_document_is_valid(tmp_path: Path) -> None:
    body = re.search(r"<<'JSON'\n(.*?)^JSON$", README.read_text(), re.S | re.M)
    assert body is not None
    document = tmp_path / "start.adl.json"
    document.write_text(body.group(1))
    result = subprocess.run(
        [sys.executable, "-m", "enforcer.cli.policy", "validate", str(document)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
