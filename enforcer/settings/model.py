"""The settings adl-exec and adl-enforcerd share, as one model (pydantic-settings): each field is
the ADL_ENFORCER_<NAME> environment variable of that name, and a key of adl-enforcerd's TOML file,
whose own settings extend this model (enforcer/daemon/config.py).

The commands load it (`load(os.environ)`) and pass values down: no module below them reads
os.environ. Embedded adl-exec reads the plain fields through enforcer/settings/launch.py, which
shares the parsing functions used here (and the egress filter's validators, enforcer/egress_values.py),
so that a launch imports no pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .. import data
from ..egress_settings import EgressSettings
from ..egress_values import EgressValues
from .launch import (
    ADL_EXEC_CGROUP_GROUP,
    PREFIX,
    SettingsError,
    absolute,
    default_values,
    describe,
    parse_bool,
    parse_cache_dir,
    parse_group,
    settings_environment,
)

# The environment `load` was given, seen by the model's sources while it validates.
_ENVIRONMENT: ContextVar[Mapping[str, str] | None] = ContextVar("adl_enforcer_settings_environment", default=None)


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over the environment given to `load`, not os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._given = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._given.items() if value != ""}


class _Defaults(PydanticBaseSettingsSource):
    """The lowest source: defaults that depend on the user and the environment (XDG_*)."""

    def __init__(self, settings_cls: type[EnforcerSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._values = settings_cls.environment_defaults(environ)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


class EnforcerSettings(BaseSettings, EgressSettings):
    """What embedded adl-exec and adl-enforcerd both read; the egress filter's fields are inherited."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", validate_default=True, env_ignore_empty=True)

    # The egress model's field, given comma-separated in the environment rather than as JSON.
    public_test_ranges: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description=EgressSettings.model_fields["public_test_ranges"].description
    )
    audit_dir: Path = Field(
        description="audit log directory (default: /var/log/adl-enforcer for root, "
        "$XDG_STATE_HOME/adl-enforcer/audit otherwise; XDG_STATE_HOME defaults to ~/.local/state)"
    )
    audit_key: Path = Field(
        description="the audit log's checkpoint signing key, kept apart from the log (default: "
        "audit-signing-key.pem in /var/lib/adl-enforcer for root, $XDG_STATE_HOME/adl-enforcer otherwise)"
    )
    cache_dir: Path | None = Field(
        description="compiled-policy cache of embedded adl-exec; 'off' turns it off (default: "
        "/var/cache/adl-enforcer/policies for root, $XDG_CACHE_HOME/adl-enforcer/policies otherwise; "
        "XDG_CACHE_HOME defaults to ~/.cache)"
    )
    baseline: Path = Field(default=data.RUNTIME_BASELINE, description="runtime baseline (default: the packaged one)")
    regions: Path = Field(default=data.REGIONS, description="region map (default: the packaged one)")
    presets: Path = Field(default=data.PRESETS, description="runtime presets catalog (default: the packaged one)")
    spec_dir: Path | None = Field(
        default=None,
        description="ADL/AAIF schemas to validate with instead of the packaged ones (adl/ and aaif/, or the "
        "published specification repositories)",
    )
    kernel_audit: bool = Field(
        default=True,
        description="read the kernel's Landlock and seccomp denials into the audit log (turning kernel "
        "auditing on for the host when it is off); off: neither",
    )
    cgroup_group: str = Field(
        default=ADL_EXEC_CGROUP_GROUP, description="cgroup directory holding the sessions (a directory name)"
    )

    @field_validator("audit_dir", "audit_key")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return absolute(value)

    @field_validator("cache_dir", mode="before")
    @classmethod
    def _cache_dir(cls, value: object) -> Path | None:
        if value is None or isinstance(value, str | Path):
            return parse_cache_dir(value)
        raise ValueError(f"expected a path or 'off', not {value!r}")

    @field_validator("kernel_audit", mode="before")
    @classmethod
    def _bool(cls, value: object) -> object:
        return parse_bool(value) if isinstance(value, str) else value

    @field_validator("cgroup_group")
    @classmethod
    def _group(cls, value: str) -> str:
        return parse_group(value)

    @classmethod
    def environment_defaults(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        return dict(default_values(environ))

    @classmethod
    def file_sources(cls, settings_cls: type[BaseSettings]) -> tuple[PydanticBaseSettingsSource, ...]:
        """Sources between the environment and the defaults (adl-enforcerd: its TOML file)."""
        return ()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRONMENT.get() or {}
        assert issubclass(settings_cls, EnforcerSettings)
        return (
            init_settings,
            _Environment(settings_cls, environ),
            *cls.file_sources(settings_cls),
            _Defaults(settings_cls, environ),
        )

    def egress(self) -> EgressValues:
        """The egress filter's part, as the values a session's filter is given."""
        return self.values()


S = TypeVar("S", bound=EnforcerSettings)


def load(environ: Mapping[str, str], model: type[S] = EnforcerSettings, **overrides: Any) -> S:  # type: ignore[assignment]
    """The settings from an environment (the command's); `overrides` win over it. SettingsError
    names each variable refused."""
    token = _ENVIRONMENT.set(settings_environment(environ))
    try:
        return model(**overrides)
    except ValidationError as exc:
        raise SettingsError(describe(exc.errors())) from None
    finally:
        _ENVIRONMENT.reset(token)
