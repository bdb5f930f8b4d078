"""The settings an embedded launch needs, read without pydantic.

enforcer/settings/model.py is the one definition of every setting (name, default, validation).
Importing pydantic costs a launch tens of milliseconds, so adl-exec reads the plain values it always
needs here, under the same names and with the same parsing functions the model validates with; a
test (tests/unit/test_settings.py) keeps the two equal. The egress filter's are validated only when
a launch uses them, from `LaunchSettings.environment`, by the validators the model uses for them
(enforcer/egress_values.py).

Nothing here reads os.environ: `read` is given the command's environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .. import data, paths
from ..quick_dataclass import dataclass

if TYPE_CHECKING:
    from ..egress_values import EgressValues

PREFIX = "ADL_ENFORCER_"
# Variables the defaults depend on; they are not settings themselves.
DEFAULT_INPUTS = ("XDG_STATE_HOME", "XDG_CACHE_HOME")
# pydantic's words for booleans, so that both loaders accept and refuse the same values.
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
ADL_EXEC_CGROUP_GROUP = "adl-enforcer"
T = TypeVar("T")


class SettingsError(ValueError):
    """A setting's value is refused; the message names the variable."""


def variable(name: str) -> str:
    return PREFIX + name.upper()


def settings_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that settings are read from: ADL_ENFORCER_* (any case, as
    pydantic-settings matches them) and the XDG variables defaults depend on; empty values are unset."""
    return {
        key: value
        for key, value in environ.items()
        if value != "" and (key.upper().startswith(PREFIX) or key in DEFAULT_INPUTS)
    }


def describe(errors: list[Any]) -> str:
    """pydantic's validation errors, each naming its setting and variable."""
    problems = []
    for error in errors:
        name = "_".join(map(str, error["loc"]))
        problems.append(f"{name} ({variable(name)}): {error['msg']}" if name else str(error["msg"]))
    return "; ".join(problems)


def parse_bool(value: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(sorted(_TRUE | _FALSE))}, not {value!r}")


def parse_group(value: str) -> str:
    if not _GROUP_NAME.fullmatch(value):
        raise ValueError(f"expected a directory name ([A-Za-z0-9_.-], not starting with '.' or '-'), not {value!r}")
    return value


def parse_cache_dir(value: str | Path | None) -> Path | None:
    """'off' turns the compiled-policy cache off (None)."""
    if value is None or str(value) == "off":
        return None
    return absolute(Path(value))


def absolute(path: Path) -> Path:
    return path if path.is_absolute() else Path.cwd() / path


def default_values(environ: Mapping[str, str]) -> dict[str, Path]:
    """The defaults that depend on who runs and on XDG_*: root's system paths, a user's XDG ones."""
    return {
        "audit_dir": paths.audit_dir(environ),
        "audit_key": paths.audit_key_path(environ),
        "cache_dir": paths.cache_dir(environ),
    }


@dataclass(frozen=True)
class LaunchSettings:
    """The plain settings, each a field of enforcer.settings.EnforcerSettings of the same name."""

    audit_dir: Path
    audit_key: Path
    cache_dir: Path | None  # None: no compiled-policy cache
    baseline: Path
    regions: Path
    presets: Path
    spec_dir: Path | None  # None: the package's own schemas
    home_region: str | None
    kernel_audit: bool
    cgroup_group: str
    environment: Mapping[str, str]  # what they were read from (settings_environment)

    def egress(self) -> EgressValues:
        """The egress filter's settings from the same environment, validated (only when a launch
        uses them) by the functions the model validates those fields with."""
        from ..egress_values import EgressValueError, validated

        given = {
            key[len(PREFIX) :].lower(): value
            for key, value in self.environment.items()
            if key.upper().startswith(PREFIX)
        }
        try:
            return validated(given)
        except EgressValueError as exc:
            raise SettingsError("; ".join(f"{name} ({variable(name)}): {msg}" for name, msg in exc.problems)) from None


def read(environ: Mapping[str, str]) -> LaunchSettings:
    """The plain settings from an environment; SettingsError names the variable refused."""
    env = settings_environment(environ)
    values = {key[len(PREFIX) :].lower(): value for key, value in env.items() if key.upper().startswith(PREFIX)}
    defaults = default_values(env)

    def parsed(name: str, parse: Callable[[str], T], default: T) -> T:
        if name not in values:
            return default
        try:
            return parse(values[name])
        except ValueError as exc:
            raise SettingsError(f"{variable(name)}: {exc}") from None

    def path(value: str) -> Path:
        return Path(value)

    def absolute_path(value: str) -> Path:
        return absolute(Path(value))

    def cache_dir(value: str) -> Path | None:
        return parse_cache_dir(value)

    default_cache: Path | None = absolute(defaults["cache_dir"])
    return LaunchSettings(
        audit_dir=parsed("audit_dir", absolute_path, defaults["audit_dir"]),
        audit_key=parsed("audit_key", absolute_path, defaults["audit_key"]),
        cache_dir=parsed("cache_dir", cache_dir, default_cache),
        baseline=parsed("baseline", path, data.RUNTIME_BASELINE),
        regions=parsed("regions", path, data.REGIONS),
        presets=parsed("presets", path, data.PRESETS),
        spec_dir=parsed("spec_dir", path, None),
        home_region=parsed("home_region", str, None),
        kernel_audit=parsed("kernel_audit", parse_bool, True),
        cgroup_group=parsed("cgroup_group", parse_group, ADL_EXEC_CGROUP_GROUP),
        environment=env,
    )
