"""The settings: one model (enforcer/settings/model.py) that adl-exec and adl-enforcerd load, the
launch path's pydantic-free reader that must agree with it, the settings table in the docs, and
no module below the commands reading the environment itself."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import PydanticUndefined

from enforcer import data, egress_values
from enforcer.daemon import notify
from enforcer.daemon.config import CONFIG_VARIABLE, Settings
from enforcer.egress_settings import EgressSettings
from enforcer.egress_values import EgressValues
from enforcer.settings import launch
from enforcer.settings.launch import PREFIX, LaunchSettings, SettingsError
from enforcer.settings.model import EnforcerSettings, load

from .test_layering import RANK, group_of, sources

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SETTINGS_DOC = REPO / "docs" / "settings.md"

# ADL_ENFORCER_* variables that are not settings of the model, and why.
NOT_SETTINGS = {
    CONFIG_VARIABLE: "names adl-enforcerd's configuration file, which holds settings",
    PREFIX + "ADDR": "adl-exec --daemon's default launch socket: an option's default on the caller's side",
    PREFIX + "LOAD_SECONDS": "the length of the daemon load test (tests/integration/test_daemon_load.py)",
}

# Modules below the commands that may touch os.environ, by module and function, and why.
ENVIRONMENT_ALLOWED = {
    ("enforcer.sandbox.creation_guard", "forget_environment"): "empties the supervisor's environment; reads nothing",
    ("enforcer.client", "default_address"): "Client() is constructed inside an agent's runtime, with no command "
    "above it to pass the daemon's socket (ADL_ENFORCER_SOCKET)",
}
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


# ---- nothing below the commands reads the environment ------------------------------------------------


def environment_uses(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every use of os.environ, os.getenv and the like in a file,
    `from os import environ` included."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if reads_environment(child):
                found.append((function, child.lineno))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def reads_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in ENVIRONMENT_NAMES and isinstance(node.value, ast.Name) and node.value.id in ("os", "posix")
    if isinstance(node, ast.ImportFrom):
        return node.module in ("os", "posix") and any(alias.name in ENVIRONMENT_NAMES for alias in node.names)
    return False


def test_no_module_below_the_commands_reads_the_environment() -> None:
    below = {m: p for m, p in sources().items() if RANK[group_of(m)] < RANK["cli"]}
    seen_allowed = set()
    wrong = []
    for module, path in sorted(below.items()):
        for function, line in environment_uses(path):
            if (module, function) in ENVIRONMENT_ALLOWED:
                seen_allowed.add((module, function))
            else:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({function})")
    assert not wrong, (
        "modules below enforcer/cli that read the environment (take the value as a parameter; the "
        "command loads enforcer.settings and passes it down):\n" + "\n".join(wrong)
    )
    stale = set(ENVIRONMENT_ALLOWED) - seen_allowed
    assert not stale, f"allow-listed environment uses that no longer exist: {stale}"


def test_the_environment_checker_finds_every_form(tmp_path: Path) -> None:
    """Control: the walker sees reads in functions, methods, at module level and by import."""
    path = tmp_path / "probe.py"
    path.write_text(
        "import os\n"
        "from os import getenv as g\n"
        "A = os.environ.get('X')\n"
        "def f():\n    return os.getenv('Y')\n"
        "class C:\n    def m(self):\n        return os.environb[b'Z']\n"
        "def harmless():\n    return os.path.join('a', 'b'), os.getpid()\n"
    )
    assert environment_uses(path) == [("<module>", 2), ("<module>", 3), ("f", 5), ("m", 8)]


# ---- the launch reader agrees with the model ------------------------------------------------------------


def plain_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(LaunchSettings) if f.name != "environment"]


def test_every_shared_setting_is_read_by_the_launch_or_validated_by_the_egress_model() -> None:
    assert set(plain_fields()) <= set(EnforcerSettings.model_fields)
    assert set(EnforcerSettings.model_fields) == set(plain_fields()) | set(EgressSettings.model_fields)
    assert set(EnforcerSettings.model_fields) <= set(Settings.model_fields)  # the daemon extends it


ENVIRONMENTS: list[dict[str, str]] = [
    {},
    {"ADL_ENFORCER_AUDIT_DIR": "/srv/audit", "ADL_ENFORCER_AUDIT_KEY": "/srv/key.pem"},
    {"ADL_ENFORCER_AUDIT_DIR": "relative/audit", "ADL_ENFORCER_AUDIT_KEY": "k.pem"},
    {"ADL_ENFORCER_AUDIT_DIR": "", "ADL_ENFORCER_HOME_REGION": ""},  # empty: unset
    {"ADL_ENFORCER_CACHE_DIR": "off"},
    {"ADL_ENFORCER_CACHE_DIR": "Off"},  # a directory of that name
    {"ADL_ENFORCER_CACHE_DIR": "cache"},
    {"ADL_ENFORCER_BASELINE": "/etc/b.yaml", "ADL_ENFORCER_REGIONS": "r.yaml", "ADL_ENFORCER_PRESETS": "/p.yaml"},
    {"ADL_ENFORCER_SPEC_DIR": "/srv/spec", "ADL_ENFORCER_HOME_REGION": "EU"},
    {"adl_enforcer_home_region": "US", "Adl_Enforcer_Cgroup_Group": "mixed"},  # any case, as pydantic-settings
    {"XDG_STATE_HOME": "/x/state", "XDG_CACHE_HOME": "/x/cache", "HOME": "/x"},
    {"ADL_ENFORCER_CGROUP_GROUP": "adl-test_1.2"},
    *({"ADL_ENFORCER_KERNEL_AUDIT": word} for word in ("off", "0", "no", "FALSE", "f", "n", " on ", "1", "yes", "T")),
    {"ADL_ENFORCER_UPSTREAM_DNS": "192.0.2.1:53", "ADL_ENFORCER_ADDR": "unix:/x", "OTHER": "1"},
]
REFUSED: list[dict[str, str]] = [
    *({"ADL_ENFORCER_KERNEL_AUDIT": word} for word in ("maybe", "of", "2", "disabled")),
    *({"ADL_ENFORCER_CGROUP_GROUP": name} for name in ("..", ".hidden", "-x", "a/b", "a b", "x\n", "é")),
]


@pytest.mark.parametrize("as_user", [False, True], ids=["root", "user"])
@pytest.mark.parametrize("environ", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "{}")
def test_the_launch_reader_reads_what_the_model_loads(
    environ: dict[str, str], as_user: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if as_user:  # the defaults of a user other than root (XDG paths)
        monkeypatch.setattr("enforcer.paths.os.geteuid", lambda: 1000)
    plain, model = launch.read(environ), load(environ)
    for name in plain_fields():
        assert getattr(plain, name) == getattr(model, name), name
    assert load(plain.environment) == model  # what the launch keeps is enough for the model


@pytest.mark.parametrize("environ", REFUSED, ids=lambda e: ",".join(f"{k}={v!r}" for k, v in e.items()))
def test_the_launch_reader_refuses_what_the_model_refuses(environ: dict[str, str]) -> None:
    (variable,) = environ
    with pytest.raises(SettingsError, match=variable) as plain:
        launch.read(environ)
    with pytest.raises(SettingsError, match=variable):
        load(environ)
    with pytest.raises(SettingsError, match=variable):
        load({}, Settings, **{variable[len(PREFIX) :].lower(): environ[variable]})  # the daemon's TOML path too
    assert str(plain.value).startswith(variable + ": ")


def test_defaults() -> None:
    plain = launch.read({})
    assert plain.kernel_audit is True and plain.cache_dir is not None and plain.spec_dir is None
    assert (plain.baseline, plain.regions, plain.presets) == (data.RUNTIME_BASELINE, data.REGIONS, data.PRESETS)
    assert plain.cgroup_group == "adl-enforcer" and Settings().cgroup_group == "adl-enforcerd"
    assert launch.read({"ADL_ENFORCER_CACHE_DIR": "off"}).cache_dir is None


# Each egress setting at and around its bounds, and the endpoints and ranges accepted and refused.
EGRESS_BOUNDS = {
    "dns_timeout_s": (["0.001", "30", " 2.5 ", "1e1"], ["0", "-1", "30.01", "nan", "inf", "two", ""]),
    "connect_timeout_s": (["0.5", "120"], ["0", "120.5", "-inf", "1s"]),
    "max_connections": (["1", "65536", " 8 "], ["0", "65537", "1.5", "8.0", "x", "-1"]),
    "sniff_timeout_ms": (["10", "5000"], ["9", "5001", "many"]),
    "message_timeout_ms": (["100", "60000"], ["99", "60001", "1e3"]),
    "upstream_dns": (
        ["192.0.2.1", "192.0.2.1:53", "[2001:db8::53]:5353", "[2001:db8::53]", "2001:db8::53", " 192.0.2.1:1 "],
        ["resolver.example:53", "resolver.example", "192.0.2.1:0", "192.0.2.1:65536", "192.0.2.1:x",
         "[2001:db8::53", "[2001:db8::53]x", "[2001:db8::53]:", "192.0.2.256", "192.0.2.1:53:53"],
    ),
    "public_test_ranges": (
        ["198.51.100.0/24", "198.51.100.0/24, 203.0.113.0/24,", "192.0.2.7", "198.51.100.128/25", "2001:db8::/32",
         "2001:db8:1::/48", "192.0.2.1/24"],
        ["8.8.8.0/24", "192.0.2.0/23", "198.51.0.0/16", "2001:db9::/32", "2001:db8::/31", "::/0", "10.0.0.1",
         "198.51.100.0/24,8.8.8.8", "garbage", '["198.51.100.0/24"]'],  # comma-separated, never JSON
    ),
}  # fmt: skip
EGRESS_ENVIRONMENTS: list[dict[str, str]] = [
    {},
    {"ADL_ENFORCER_UPSTREAM_DNS": "[2001:db8::53]:5353", "ADL_ENFORCER_HOME_REGION": "EU"},
    {"ADL_ENFORCER_PUBLIC_TEST_RANGES": "198.51.100.0/24, 203.0.113.0/24,", "adl_enforcer_dns_timeout_s": "0.5"},
    {"ADL_ENFORCER_CONNECT_TIMEOUT_S": "7", "ADL_ENFORCER_MAX_CONNECTIONS": "12", "XDG_STATE_HOME": "/x"},
    {
        "ADL_ENFORCER_SNIFF_TIMEOUT_MS": "10",
        "ADL_ENFORCER_MESSAGE_TIMEOUT_MS": "60000",
        "ADL_ENFORCER_UPSTREAM_DNS": "",
    },
    *({launch.variable(name): value} for name, (good, _) in EGRESS_BOUNDS.items() for value in good),
]
EGRESS_REFUSED: list[dict[str, str]] = [
    *({launch.variable(name): value} for name, (_, bad) in EGRESS_BOUNDS.items() for value in bad if value),
    {"ADL_ENFORCER_DNS_TIMEOUT_S": "0", "ADL_ENFORCER_MAX_CONNECTIONS": "x", "ADL_ENFORCER_UPSTREAM_DNS": "a"},
]


def test_the_egress_values_are_the_egress_model() -> None:
    assert list(EgressSettings.model_fields) == list(egress_values.NAMES) == list(egress_values.CHECKS)
    assert EgressSettings().values() == EgressValues() == launch.read({}).egress() == load({}).egress()


@pytest.mark.parametrize("environ", EGRESS_ENVIRONMENTS, ids=str)
def test_a_launch_validates_egress_settings_as_the_model_does(environ: dict[str, str]) -> None:
    values = launch.read(environ).egress()
    assert isinstance(values, EgressValues) and values == load(environ).egress()
    daemon = load({}, Settings, **{k[len(PREFIX) :].lower(): v for k, v in settings_of(environ).items()})
    assert values == daemon.egress()  # the daemon's TOML path


def settings_of(environ: dict[str, str]) -> dict[str, str]:
    return {k.upper(): v for k, v in environ.items() if k.upper().startswith(PREFIX) and v != ""}


@pytest.mark.parametrize("environ", EGRESS_REFUSED, ids=str)
def test_a_launch_refuses_egress_settings_the_model_refuses(environ: dict[str, str]) -> None:
    plain = launch.read(environ)  # the plain settings leave them alone: a launch without a network is not refused
    with pytest.raises(SettingsError) as refused:
        plain.egress()
    for variable in environ:
        assert f"({variable}): " in str(refused.value)
    with pytest.raises(SettingsError) as model:
        load(environ)
    assert str(refused.value) == str(model.value)
    with pytest.raises(SettingsError) as daemon:  # the daemon's TOML path too
        load({}, Settings, **{k[len(PREFIX) :].lower(): v for k, v in environ.items()})
    assert str(daemon.value) == str(model.value)


# Values as adl-enforcerd's TOML file gives them (numbers, lists), through the model and the dataclass.
TYPED_ACCEPTED: list[dict[str, Any]] = [
    {"dns_timeout_s": 30, "connect_timeout_s": 0.25, "max_connections": 65536, "sniff_timeout_ms": 10},
    {"max_connections": 8.0, "message_timeout_ms": 100, "public_test_ranges": ["2001:db8::/64", "192.0.2.0/24"]},
    {"upstream_dns": "[2001:db8::53]:53", "home_region": "EU", "public_test_ranges": []},
]
TYPED_REFUSED: list[dict[str, Any]] = [
    {"dns_timeout_s": 0},
    {"dns_timeout_s": True},
    {"dns_timeout_s": float("nan")},
    {"connect_timeout_s": 120.5},
    {"max_connections": 1.5},
    {"max_connections": False},
    {"max_connections": 0},
    {"sniff_timeout_ms": [10]},
    {"message_timeout_ms": 60001},
    {"upstream_dns": 53},
    {"upstream_dns": "192.0.2.1:70000"},
    {"public_test_ranges": ["203.0.112.0/23"]},
    {"public_test_ranges": [198]},
    {"public_test_ranges": {"198.51.100.0/24": True}},
    {"home_region": 3},
]


@pytest.mark.parametrize("values", TYPED_ACCEPTED, ids=str)
def test_typed_egress_values_are_accepted_alike(values: dict[str, Any]) -> None:
    expected = EgressValues(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    assert load({}, Settings, **values).egress() == EgressSettings(**values).values() == expected
    assert expected == egress_values.validated(values)


@pytest.mark.parametrize("values", TYPED_REFUSED, ids=str)
def test_typed_egress_values_are_refused_alike(values: dict[str, Any]) -> None:
    ((name, _),) = values.items()
    with pytest.raises(SettingsError) as model:
        load({}, Settings, **values)
    with pytest.raises(ValueError) as plain:
        EgressValues(**values)
    with pytest.raises(egress_values.EgressValueError) as validated:
        egress_values.validated(values)
    assert validated.value.problems == [(name, str(plain.value))]
    assert str(model.value) == f"{name} ({launch.variable(name)}): {plain.value}"


def test_egress_settings_are_validated_by_the_model_with_the_variable_named() -> None:
    settings = load({"ADL_ENFORCER_DNS_TIMEOUT_S": "3.5", "ADL_ENFORCER_HOME_REGION": "EU"}).egress()
    assert isinstance(settings, EgressValues) and settings.dns_timeout_s == 3.5 and settings.home_region == "EU"
    with pytest.raises(SettingsError, match=r"ADL_ENFORCER_DNS_TIMEOUT_S\): Input should be less than or equal"):
        load({"ADL_ENFORCER_DNS_TIMEOUT_S": "300"})
    # The launch reader leaves them to the model: a launch without a network layer does not validate them.
    assert launch.read({"ADL_ENFORCER_DNS_TIMEOUT_S": "300"}).environment == {"ADL_ENFORCER_DNS_TIMEOUT_S": "300"}
    with pytest.raises(SettingsError, match=r"^dns_timeout_s \(ADL_ENFORCER_DNS_TIMEOUT_S\): Input should be less"):
        launch.read({"ADL_ENFORCER_DNS_TIMEOUT_S": "300"}).egress()


def test_the_model_reads_only_the_environment_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADL_ENFORCER_HOME_REGION", "from-os-environ")
    monkeypatch.setenv("ADL_ENFORCER_WORKERS", "3")
    assert load({}).home_region is None and Settings().workers == 16
    assert load({"ADL_ENFORCER_HOME_REGION": "EU"}).home_region == "EU"


def test_a_launch_reading_its_settings_imports_no_pydantic() -> None:
    """Nor when it validates the egress filter's."""
    probe = (
        "import os, sys\n"
        "from enforcer.cli import exec, exec_embedded\n"
        "from enforcer.settings import launch\n"
        "settings = launch.read({'ADL_ENFORCER_KERNEL_AUDIT': 'off', 'ADL_ENFORCER_UPSTREAM_DNS': '192.0.2.1:53'})\n"
        "def loaded(): return sorted(m for m in sys.modules if m.startswith(('pydantic', 'enforcer.settings.model')))\n"
        "print(loaded())\n"
        "settings.egress()\n"
        "print(loaded())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    plain, egress = out.stdout.splitlines()
    assert plain == "[]"
    assert egress == "[]"


# ---- systemd's variables are read by the command ---------------------------------------------------------


def test_systemd_variables() -> None:
    assert notify.Systemd.from_environment({}, 7) == notify.Systemd(None, 0.0)
    env = {"NOTIFY_SOCKET": "@sd", "WATCHDOG_USEC": "400000"}
    assert notify.Systemd.from_environment(env, 7) == notify.Systemd("@sd", 0.4)
    assert notify.Systemd.from_environment({**env, "WATCHDOG_PID": "7"}, 7).watchdog_s == 0.4
    assert notify.Systemd.from_environment({**env, "WATCHDOG_PID": "8"}, 7).watchdog_s == 0.0  # another's
    assert notify.Systemd.from_environment({**env, "WATCHDOG_USEC": "x"}, 7).watchdog_s == 0.0
    assert not notify.Systemd().send("READY=1")


# ---- the documentation lists every setting, and only settings ---------------------------------------------


def documented_table() -> dict[str, tuple[str, str]]:
    """docs/settings.md's rows: setting -> (variable, default)."""
    rows = {}
    for line in SETTINGS_DOC.read_text().splitlines():
        found = re.match(r"^\| `([a-z0-9_]+)` \| `(ADL_ENFORCER_[A-Z0-9_]+)` \| ([^|]*) \|", line)
        if found:
            rows[found.group(1)] = (found.group(2), found.group(3).strip())
    return rows


def default_text(name: str) -> str:
    """How docs/settings.md states a setting's default (adl-exec's, then the daemon's where they differ)."""
    daemon = stated_default(Settings.model_fields[name])
    if name in EnforcerSettings.model_fields:
        shared = stated_default(EnforcerSettings.model_fields[name])
        return shared if shared == daemon else f"{shared} (daemon: {daemon})"
    return daemon


def stated_default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "see meaning"  # depends on the user and XDG_*
    else:
        value = field.default
    if isinstance(value, Path):
        return "packaged" if value.is_relative_to(data.DATA_DIR) else f"`{value}`"
    if value is None:
        return "unset"
    if value in ([], {}, ""):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def test_the_settings_table_is_the_model() -> None:
    rows = documented_table()
    fields = Settings.model_fields
    assert set(rows) == set(fields), (
        f"docs/settings.md lists settings the model does not have: {sorted(set(rows) - set(fields))}; "
        f"and misses: {sorted(set(fields) - set(rows))}"
    )
    for name, (variable, default) in rows.items():
        assert variable == launch.variable(name), name
        assert default == default_text(name), f"{name}: documented default {default}, not {default_text(name)}"
    shared = {name for name in rows if name in EnforcerSettings.model_fields}
    marked = {
        m.group(1) for m in re.finditer(r"^\| `([a-z0-9_]+)` \|.*\| both \|$", SETTINGS_DOC.read_text(), re.MULTILINE)
    }
    assert marked == shared, "the `both` column marks exactly the settings adl-exec reads too"


def test_every_variable_the_docs_and_help_name_is_a_setting() -> None:
    from enforcer.cli import audit, enforcerd, exec

    texts = [path.read_text() for path in DOCS]
    texts += [parser.format_help() for parser in (exec.build_parser(), enforcerd.build_parser(), audit.build_parser())]
    named = {m for text in texts for m in re.findall(r"ADL_ENFORCER_[A-Z0-9_]+", text) if not m.endswith("_")}
    unknown = {v for v in named if v not in NOT_SETTINGS and v[len(PREFIX) :].lower() not in Settings.model_fields}
    assert not unknown, f"documented variables that are no setting: {sorted(unknown)}"
    egress_rows = re.findall(r"^\| `([A-Z_]+)` \|", (REPO / "docs" / "egress.md").read_text(), re.MULTILINE)
    assert egress_rows and {row.lower() for row in egress_rows} <= set(EgressSettings.model_fields)


if __name__ == "__main__":  # print docs/settings.md's table rows from the model
    for name, field in Settings.model_fields.items():
        both = "both" if name in EnforcerSettings.model_fields else "daemon"
        meaning = (field.description or "").replace("|", "\\|")
        print(f"| `{name}` | `{launch.variable(name)}` | {default_text(name)} | {meaning} | {both} |")


# ---- the commands hand the settings down --------------------------------------------------------------------


def command(module: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIX)}
    return subprocess.run(
        [sys.executable, "-m", f"enforcer.cli.{module}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
        cwd=REPO,
    )


def test_the_commands_pass_the_spec_dir_down(tmp_path: Path) -> None:
    """ADL_ENFORCER_SPEC_DIR reaches validation in adl-policy and in adl-exec (an empty tree is refused)."""
    document = str(REPO / "policies" / "examples" / "coding-agent.adl.json")
    assert command("policy", "validate", document, env={}).returncode == 0
    refused = command("policy", "validate", document, env={"ADL_ENFORCER_SPEC_DIR": str(tmp_path)})
    assert refused.returncode != 0 and f"ADL_ENFORCER_SPEC_DIR={tmp_path}" in refused.stderr
    env = {"ADL_ENFORCER_SPEC_DIR": str(tmp_path), "ADL_ENFORCER_CACHE_DIR": "off"}
    explained = command("exec", "--adl", document, "--explain", "--", "python3", env=env)
    assert explained.returncode == 125 and f"ADL_ENFORCER_SPEC_DIR={tmp_path}" in explained.stderr


def test_the_commands_refuse_an_invalid_setting_naming_it(tmp_path: Path) -> None:
    document = str(REPO / "policies" / "examples" / "coding-agent.adl.json")
    commands = (("exec", ("--adl", document, "--", "true")), ("audit", ("verify",)), ("policy", ("examples",)))
    for module, args in commands:
        refused = command(module, *args, env={"ADL_ENFORCER_KERNEL_AUDIT": "maybe"})
        assert refused.returncode == 2 and "ADL_ENFORCER_KERNEL_AUDIT" in refused.stderr, (module, refused.stderr)
    daemon = command("enforcerd", "--print-config", env={"ADL_ENFORCER_CGROUP_GROUP": ".."})
    assert daemon.returncode == 2 and "ADL_ENFORCER_CGROUP_GROUP" in daemon.stderr


def test_the_daemon_loads_the_shared_settings(tmp_path: Path) -> None:
    env = {"ADL_ENFORCER_KERNEL_AUDIT": "off", "ADL_ENFORCER_SPEC_DIR": str(tmp_path), "ADL_ENFORCER_CACHE_DIR": "off"}
    printed = command("enforcerd", "--print-config", "--json", env=env)
    assert printed.returncode == 0, printed.stderr
    effective = json.loads(printed.stdout)
    assert effective["kernel_audit"] is False and effective["spec_dir"] == str(tmp_path)
    assert "cache_dir" not in effective and effective["cgroup_group"] == "adl-enforcerd"
    audit = command("audit", "verify", env={"ADL_ENFORCER_AUDIT_DIR": str(tmp_path / "none")})
    assert audit.returncode != 0 and f"no audit log in {tmp_path / 'none'}" in audit.stderr
