"""adl-enforcerd configuration: defaults, then the TOML file, then ADL_ENFORCER_* environment
variables. The settings it shares with adl-exec (audit log, baseline, region map, egress filter...)
are inherited from enforcer/settings.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from .. import paths
from ..settings.launch import PREFIX, SettingsError
from ..settings.model import EnforcerSettings, load
from . import affinity
from .quota import RECORD_BASE_BYTES

DEFAULT_CONFIG_FILE = Path("/etc/adl-enforcer/enforcer.toml")
CONFIG_VARIABLE = PREFIX + "CONFIG"  # names the file; not a setting


class Settings(EnforcerSettings):
    """The daemon's settings; those it shares with adl-exec (audit_dir, baseline, upstream_dns...) are inherited."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", validate_default=True, env_ignore_empty=True)

    policy_dir: Path = Field(
        default=Path("/etc/adl-enforcer/policies"),
        description="ADL/AAIF documents; it and every directory above it writable only by root or the daemon's user",
    )
    socket: Path = Field(description="API socket (Check)")
    admin_socket: Path = Field(description="admin socket (approvals, reload), 0600")
    launch_socket: Path = Field(description="launch socket used by adl-exec --daemon")
    socket_group: str | None = Field(default=None, description="group owning the API and launch sockets (0660)")
    audit_group_ms: float = Field(default=5.0, gt=0, le=1000, description="group commit interval")
    audit_group_records: int = Field(default=64, ge=1, description="group commit after this many records")
    production: bool = Field(default=False, description="refuse draft lifecycle documents too")
    cgroup_group: str = Field(default="adl-enforcerd", description="cgroup directory holding the sessions")
    helper_memory_mb: int = Field(
        default=512,
        ge=64,
        description="memory limit of each session's root helpers (its supervisor and egress filter), "
        "in their own cgroup <cgroup_group>.helpers",
    )
    prepared_sessions: int = Field(
        default=2,
        ge=0,
        le=16,
        description="session supervisors the spawner keeps forked and waiting, with their stage, before any "
        "launch order; 0 forks each at its order",
    )
    workers: int = Field(default=16, ge=1, le=256, description="gRPC worker threads per socket")
    api_cpus: str = Field(
        default="one",
        description='CPUs for the gRPC process (not sessions): "one" (the last allowed), "all", or a list "0,2"',
    )
    inline_check: bool = Field(
        default=True,
        description="serve Check and CheckBatch on the inline loop; false: on the gRPC worker threads (slower)",
    )
    inline_nice: int = Field(
        default=-10,
        ge=-20,
        le=0,
        description="nice value of the inline loop's thread: below 0, gRPC's I/O threads wait for its batch "
        "instead of interrupting it (needs CAP_SYS_NICE or LimitNICE); 0 leaves it as the other threads",
    )
    max_request_bytes: int = Field(default=1 << 20, ge=1024, description="larger requests get INVALID_ARGUMENT")
    max_pending_approvals: int = Field(default=10_000, ge=1, description="pending approvals, all agents together")
    max_pending_per_agent: int = Field(
        default=1_000, ge=1, description="pending approvals of one agent: one agent's flood leaves the others room"
    )
    max_pending_per_uid: int = Field(
        default=1_000, ge=1, description="pending approvals opened for the sessions of one uid"
    )
    max_approval_waits: int = Field(
        default=256,
        ge=1,
        le=4096,
        description="WaitApproval calls waiting at once, a quarter per uid; they get threads beyond `workers`",
    )
    max_sessions_per_uid: int = Field(
        default=32,
        ge=1,
        description="sessions one caller uid may run at once, whatever the agents; beyond, its launches are "
        "refused (and recorded, within launch_refusals_per_uid): one member of socket_group cannot take the "
        "sessions' tasks and the daemon's memory from the others. Root never runs a session, so never counts",
    )
    max_sessions: int = Field(
        default=256,
        ge=1,
        description="sessions running at once, every caller together: each holds a root supervisor and its "
        "egress filter besides the agent; beyond, launches are refused",
    )
    session_tasks_share_per_uid: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="the share of all sessions' tasks (40% of the host's: kernel.pid_max or threads-max, the "
        "lower) one caller uid's sessions may hold together, counted by the pids_max each asked for; a launch "
        "that would pass it is refused. Sessions at their own limit fill the bound every caller shares; "
        "at 0.25 it takes four uids to do so",
    )
    max_pids: int = Field(
        default=4096, ge=1, description="the largest pids_max a caller may ask for; larger launches are refused"
    )
    allowed_unenforced: list[str] = Field(
        default_factory=list,
        description="domains (filesystem, execution, environment, network, resources) a caller may accept "
        "as unenforced; a launch accepting any other is refused. Default: none",
    )
    agent_callers: dict[str, list[str]] = Field(
        default_factory=dict,
        description='who may launch each agent, by agent key, id or name ("*": every agent): "uid:N", '
        '"user:NAME", "group:NAME" (primary or supplementary). Default: root only',
    )
    launch_request_s: float = Field(
        default=5.0, gt=0, le=60, description="a launch request must arrive whole within this many seconds"
    )
    api_request_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="an API request must arrive whole within this many seconds of its first frame, or its "
        "connection is closed",
    )
    max_api_connections: int = Field(
        default=4096, ge=1, description="open connections to the API socket; more are closed at once"
    )
    max_launch_connections: int = Field(
        default=4096, ge=1, description="launch connections waiting for their request; more are closed at once"
    )
    audit_retry_s: float = Field(default=1.0, gt=0, description="how often a failed audit log is reopened")
    metrics_listen: str = Field(
        default="",
        description="HOST:PORT for a Prometheus /metrics endpoint (the prometheus extra); empty: off",
    )
    otel: bool = Field(
        default=False,
        description="export a span per decision over OTLP (the otel extra; OTEL_EXPORTER_OTLP_* configure it)",
    )

    # -- bounds on what one caller can cost the others (enforcer/daemon/arguments.py, auditsink.py) --
    max_argument_depth: int = Field(default=32, ge=1, le=200, description="nesting of a Check's tool arguments")
    max_argument_items: int = Field(
        default=10_000, ge=1, description="members and elements in a Check's tool arguments (a batch's together)"
    )
    max_argument_string: int = Field(default=262_144, ge=1, description="characters in one argument string")
    audit_write_deadline_s: float = Field(
        default=10.0, gt=0, description="an audit write not returned by then: health NOT_SERVING, no watchdog ping"
    )
    check_audit_bytes_per_uid: int = Field(
        default=32 << 20,
        ge=1 << 16,
        description="decision records one caller uid (root aside) may add to the audit log within any "
        "audit_budget_window_s seconds (sliding, by tenths of it), in bytes (a request's size, its strings "
        "as its record escapes them, plus 1 KiB taken before it is decided, the rest of its record's size "
        "after); beyond, its Check, CheckBatch and Explain get RESOURCE_EXHAUSTED undecided, counted in a "
        "summary record when the window ends",
    )
    launch_refusals_per_uid: int = Field(
        default=100,
        ge=1,
        description="launch refusals of one caller uid recorded in detail within any audit_budget_window_s "
        "seconds (sliding, by tenths of it); the rest "
        "are answered and counted in a summary record when the window ends",
    )
    audit_budget_window_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="the sliding window of check_audit_bytes_per_uid and launch_refusals_per_uid; "
        "their summaries count refusals per fixed window of this length",
    )

    @model_validator(mode="after")
    def _budget_fits_a_request(self) -> Settings:
        if self.check_audit_bytes_per_uid < self.max_request_bytes + RECORD_BASE_BYTES:
            raise ValueError(
                f"check_audit_bytes_per_uid ({self.check_audit_bytes_per_uid}) must hold at least one request of "
                f"max_request_bytes ({self.max_request_bytes}) and its record ({RECORD_BASE_BYTES} bytes more)"
            )
        return self

    @field_validator("allowed_unenforced")
    @classmethod
    def _domains(cls, value: list[str]) -> list[str]:
        from ..sandbox import DOMAINS

        unknown = set(value) - set(DOMAINS)
        if unknown:
            raise ValueError(f"takes {', '.join(DOMAINS)}; not {', '.join(sorted(unknown))}")
        return value

    @field_validator("agent_callers")
    @classmethod
    def _callers(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for agent, callers in value.items():
            for caller in callers:
                kind, _, name = caller.partition(":")
                if kind not in ("uid", "user", "group") or not name or (kind == "uid" and not name.isdigit()):
                    raise ValueError(f"agent_callers[{agent!r}]: {caller!r} is not uid:N, user:NAME or group:NAME")
        return value

    @field_validator("api_cpus")
    @classmethod
    def _cpus(cls, value: str) -> str:
        return affinity.validate(value)

    @field_validator("policy_dir", "socket", "admin_socket", "launch_socket", "audit_dir", "audit_key")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value if value.is_absolute() else Path.cwd() / value

    @classmethod
    def environment_defaults(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        run = paths.runtime_dir(environ)
        return {
            **super().environment_defaults(environ),
            "socket": run / "api.sock",
            "admin_socket": run / "admin.sock",
            "launch_socket": run / "launch.sock",
        }

    @classmethod
    def file_sources(cls, settings_cls: type[BaseSettings]) -> tuple[PydanticBaseSettingsSource, ...]:
        return (TomlConfigSettingsSource(settings_cls, toml_file=_config_file),)


_config_file: Path | None = None


class ConfigError(Exception):
    pass


def config_file(explicit: Path | None, environ: Mapping[str, str]) -> Path | None:
    """--config, else $ADL_ENFORCER_CONFIG, else /etc/adl-enforcer/enforcer.toml when it exists."""
    if explicit is not None:
        return explicit
    configured = environ.get(CONFIG_VARIABLE)
    if configured:
        return Path(configured)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None


def load_settings(explicit: Path | None, environ: Mapping[str, str], **overrides: Any) -> Settings:
    """From the command's environment and the configuration file it names (or --config)."""
    global _config_file
    path = config_file(explicit, environ)
    if path is not None and not path.is_file():
        raise ConfigError(f"{path}: no such configuration file")
    _config_file = path
    try:
        return load({k: v for k, v in environ.items() if k != CONFIG_VARIABLE}, Settings, **overrides)
    except (SettingsError, ValueError) as exc:  # invalid values, TOML syntax errors
        raise ConfigError(f"{path or 'configuration'}: {exc}") from exc
    finally:
        _config_file = None


def as_plain(settings: Settings) -> dict[str, Any]:
    """Settings as TOML/JSON-ready values (paths as strings, unset values left out)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in settings.model_dump().items() if v is not None}
