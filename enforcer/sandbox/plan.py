"""From a compiled Policy and a command to a launch plan: every kernel rule, mask, variable and limit
the child will apply, decided in the parent where errors can still be reported cleanly. Reads the
filesystem (PATH lookups, which paths exist, denied files to mask) but changes nothing.

Every grant is decided by the same decide() the API uses, so `adl-policy check` and the sandbox
cannot disagree about what a pattern means.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..policy import EnvVar, Policy, ProcessExec, decide
from ..policy.decider import SHELLS
from ..policy.errors import Refusal
from ..policy.patterns import PatternList
from ..quick_dataclass import dataclass
from . import DOMAINS, landlock, seccomp
from .cgroups import Limits
from .execmounts import ExecMounts
from .seccomp import SeccompPlan

if TYPE_CHECKING:
    from ..egress_values import EgressValues  # only plans with a network layer load it
    from . import creation_guard  # loaded by plans with a guard or denied patterns

LayerStatus = Literal["active", "unavailable", "accepted-unenforced", "not declared"]
DEFAULT_PIDS_MAX = 512
MAX_MASK_WALK = 50_000  # entries visited per allowed tree when looking for denied files
GLOB_CHARS = set("*?[{")


class PlanError(Refusal):
    """The launch must be refused (exit 125); the message says what and why."""


@dataclass(frozen=True)
class Baseline:
    path: Path
    digest: str
    read: tuple[str, ...]
    read_write: tuple[str, ...]
    read_device: tuple[str, ...]
    execute: tuple[str, ...]
    proc_self: bool
    search_path: str
    library: tuple[str, ...] = ()  # directories code may be mapped from (top level), globs expanded
    library_trees: tuple[str, ...] = ()  # the same, subdirectories included


def load_baseline(path: Path) -> Baseline:
    from ..data import parsed

    raw = path.read_bytes()
    found, data = parsed.lookup("baseline", raw)  # the packaged baseline needs no YAML parser
    if not found:
        data = parse_baseline(raw)
    data = data or {}

    def paths(key: str) -> tuple[str, ...]:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("/") for v in value):
            raise PlanError(f"{path}: '{key}' must be a list of absolute paths")
        return tuple(value)

    return Baseline(
        path=path,
        digest="sha256:" + hashlib.sha256(raw).hexdigest(),
        read=paths("read"),
        read_write=paths("read_write"),
        read_device=paths("read_device"),
        execute=paths("execute"),
        proc_self=bool(data.get("proc_self", False)),
        search_path=str(data.get("path") or "/usr/bin:/bin"),
        library=_expand(paths("library")),
        library_trees=_expand(paths("library_trees")),
    )


def parse_baseline(raw: bytes) -> Any:
    from ruamel.yaml import YAML  # only for a baseline neither cached nor packaged

    return YAML(typ="safe").load(raw)


def _expand(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """Glob patterns to the real paths of the directories they name on this host."""
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)) if GLOB_CHARS & set(pattern) else [pattern]:
            real = os.path.realpath(path)
            if os.path.isdir(real) and real not in found:
                found.append(real)
    return tuple(found)


@dataclass
class Layer:
    name: str
    mechanism: str
    status: LayerStatus
    details: list[str] = field(default_factory=list)


@dataclass
class LaunchPlan:
    argv: list[str]
    executable: str
    env: dict[str, str]
    env_dropped: list[str]
    landlock: landlock.LandlockPlan
    file_masks: list[str]
    dir_masks: list[str]
    seccomp: SeccompPlan
    limits: Limits
    timeout_s: float | None
    layers: list[Layer]
    accepted_unenforced: list[str]
    baseline: Baseline
    secrets: list[str]  # values of secret variables handed over: masked out of the audit log
    refusals: list[str]  # explain_only: why a real launch would be refused
    creation_denied: creation_guard.DeniedNames | None = None  # path -> denied pattern it matches
    egress: EgressValues | None = None  # None: an empty network namespace, nothing leaves
    exec_mounts: ExecMounts | None = None  # what stays executable; every other mount is noexec
    residual: list[str] = field(default_factory=list)  # what this kernel cannot close: explained and in the evidence


@dataclass(frozen=True)
class HostFeatures:
    landlock_abi: int
    cgroups: str  # v2 | v1 | none
    egress_tools_missing: tuple[str, ...] = ()  # programs the egress filter needs (nft, ip) not installed


def _with_real_denied(fs: Any, cwd: str, home: str) -> Any:
    """The filesystem rules with every denied pattern also spelled by the real path of its literal
    prefix. Landlock follows symbolic links when it applies a grant, and masks and the creation guard
    see real paths: a directory granted through a link and denied by its real path (or the reverse)
    must stay denied under both spellings."""
    if fs is None or not fs.denied.patterns:
        return fs
    patterns = list(fs.denied.patterns)
    for pattern in fs.denied.patterns:
        prefix = literal_prefix(pattern, cwd, home)
        real = os.path.realpath(prefix)
        if real == prefix:
            continue
        segments = pattern.split("/")
        first_glob = next((i for i, segment in enumerate(segments) if GLOB_CHARS & set(segment)), len(segments))
        rest = "/".join(segments[first_glob:])
        resolved = real.rstrip("/") + "/" + rest if rest else real
        if resolved not in patterns:
            patterns.append(resolved)
    if len(patterns) == len(fs.denied.patterns):
        return fs
    try:
        denied = PatternList.compile(patterns, "path")
    except ValueError as exc:
        raise PlanError(f"denied_paths: a pattern's real path is not a valid pattern: {exc}") from None
    return dataclasses.replace(fs, denied=denied)


def literal_prefix(pattern: str, cwd: str, home: str) -> str:
    if pattern.startswith("~/") or pattern == "~":
        pattern = home + pattern[1:]
    if not pattern.startswith("/"):
        pattern = os.path.join(cwd, pattern)
    parts: list[str] = []
    for segment in pattern.split("/"):
        if GLOB_CHARS & set(segment):
            break
        parts.append(segment)
    return os.path.normpath("/".join(parts) or "/")


@dataclass
class Unenforced:
    """The layers this host cannot enforce. Each is refused (PlanError), unless the operator accepted it
    with --accept-unenforced or the plan is only being explained; both are kept, in layer order."""

    accept: frozenset[str]
    explain_only: bool = False
    accepted: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def status(self, domain: str, missing: str | None) -> LayerStatus:
        """The status of `domain`'s layer, given what is missing to enforce it (None: nothing)."""
        if missing is None:
            return "active"
        if domain in self.accept:
            self.accepted.append(domain)
            return "accepted-unenforced"
        refusal = f"{missing}; refusing to run with '{domain}' unenforced (--accept-unenforced {domain} to accept)"
        if not self.explain_only:
            raise PlanError(refusal)
        self.refusals.append(refusal)
        return "unavailable"


Grants = list[tuple[str, int]]  # Landlock rules: path, rights


@dataclass
class Masks:
    """What the child hides in its mount namespace: denied files and directories."""

    files: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)


@dataclass
class BaselinePart:
    grants: Grants
    masks: Masks  # baseline paths a denied pattern names: masked, never granted
    details: list[str]


@dataclass
class FilesystemPart:
    grants: Grants
    writable: list[str]  # real paths of the write and read_write grants
    layer: Layer


@dataclass
class ExecutionPart:
    executable: str  # argv[0] resolved against the baseline's PATH
    grants: Grants
    mounts: ExecMounts
    layer: Layer


@dataclass
class EnvironmentPart:
    env: dict[str, str]
    dropped: list[str]
    secrets: list[str]
    layer: Layer


@dataclass
class NetworkPart:
    layer: Layer
    egress: EgressValues | None  # None: nothing leaves the namespace
    missing: str | None = None  # what this host lacks to enforce the declared network


@dataclass
class ResourcesPart:
    limits: Limits
    timeout_s: float | None
    layer: Layer
    missing: str | None = None


def build_plan(
    policy: Policy,
    argv: list[str],
    *,
    baseline: Baseline,
    environ: dict[str, str],
    features: HostFeatures,
    accept_unenforced: frozenset[str] = frozenset(),
    cwd: str | None = None,
    pids_max: int = DEFAULT_PIDS_MAX,
    explain_only: bool = False,
    egress: EgressValues | Callable[[], EgressValues] | None = None,
) -> LaunchPlan:
    """Raises PlanError for anything that must be refused; with explain_only, layers that cannot be
    enforced are reported as unavailable (and in `refusals`) instead. `egress`: the egress filter's
    settings, or a function that loads them, called only for a plan with a network layer (None:
    their defaults)."""
    check_request(policy, argv, accept_unenforced)
    cwd = cwd or os.getcwd()
    home = environ.get("HOME", "/")
    abi = features.landlock_abi
    unenforced = Unenforced(accept_unenforced, explain_only)
    # Decided first: a host without Landlock is refused before any tree is walked.
    no_landlock = None if abi else "Landlock is not available on this kernel"
    fs_status = unenforced.status("filesystem", no_landlock)
    exec_status = unenforced.status("execution", no_landlock)

    fs = _with_real_denied(policy.filesystem, cwd, home)
    base = baseline_grants(baseline, fs.denied if fs is not None and fs.denied.patterns else None, cwd, home)
    files = filesystem(fs, base, cwd, home, abi)
    files.layer.status = fs_status
    creation_denied = _creation_matcher(fs, files.writable)
    masks = base.masks
    masks_layers: list[Layer] = []
    if fs is not None:
        guarded = creation_denied is not None and bool(fs.denied.patterns)
        masks_layer, masks = denied_masks(fs, cwd, home, base.masks, guarded=guarded)
        masks_layers.append(masks_layer)
    run = execution(policy, argv, baseline, cwd, files.writable, abi)
    run.layer.status = exec_status
    env = environment(policy, environ, baseline.search_path)
    net = network(policy, features.egress_tools_missing, egress)
    net.layer.status = unenforced.status("network", net.missing)
    seccomp_plan, syscalls_layer = syscalls(creation_denied)
    gaps, residual_layer = residual(policy)
    res = resources(policy, features.cgroups, pids_max)
    res.layer.status = unenforced.status("resources", res.missing)
    return LaunchPlan(
        argv=list(argv),
        executable=run.executable,
        env=env.env,
        env_dropped=env.dropped,
        landlock=landlock_rules(abi, base.grants + files.grants + run.grants, via_filter=net.egress is not None),
        file_masks=masks.files,
        dir_masks=masks.dirs,
        seccomp=seccomp_plan,
        limits=res.limits,
        timeout_s=res.timeout_s,
        layers=[
            files.layer,
            run.layer,
            *masks_layers,
            env.layer,
            net.layer,
            syscalls_layer,
            privileges(),
            residual_layer,
            res.layer,
        ],
        accepted_unenforced=unenforced.accepted,
        baseline=baseline,
        secrets=env.secrets,
        refusals=unenforced.refusals,
        creation_denied=creation_denied,
        egress=net.egress,
        exec_mounts=run.mounts,
        residual=gaps,
    )


def check_request(policy: Policy, argv: list[str], accept_unenforced: frozenset[str]) -> None:
    """What is refused before anything is looked at: the document itself, the command line."""
    unknown = accept_unenforced - set(DOMAINS)
    if unknown:
        raise PlanError(f"--accept-unenforced takes {', '.join(DOMAINS)}; not {', '.join(sorted(unknown))}")
    if policy.lifecycle.verdict == "refuse":
        raise PlanError(f"lifecycle: {policy.lifecycle.reason}")
    if policy.signature == "invalid":
        raise PlanError("the document's signature does not verify")
    if not argv:
        raise PlanError("no command given (adl-exec --adl FILE -- COMMAND ARGS...)")


def landlock_rules(abi: int, grants: Grants, *, via_filter: bool) -> landlock.LandlockPlan:
    rules = landlock.LandlockPlan(abi)
    for path, rights in grants:
        rules.add(path, rights)
    # The capture sends every connect to the filter, which decides and audits it; a Landlock port
    # rule would refuse some attempts earlier but leave them out of the audit log.
    rules.deny_tcp_connect = not via_filter
    return rules


def baseline_grants(baseline: Baseline, denied: PatternList | None, cwd: str, home: str) -> BaselinePart:
    """The runtime baseline's grants. A denied pattern wins over it: what it matches is masked, not
    granted, including what it matches inside the baseline's directories."""
    grants: Grants = []
    masks = Masks()
    details = [f"baseline {baseline.path} ({baseline.digest[:19]}…)"]
    directories: list[str] = []
    for paths, rights, label in (
        (baseline.read, landlock.READ, "read"),
        (baseline.read_write, landlock.READ | landlock.WRITE_FILE | landlock.TRUNCATE, "read/write"),
        (baseline.read_device, landlock.READ_FILE, "read"),
        (baseline.execute, landlock.READ_FILE | landlock.EXECUTE, "execute"),
    ):
        for p in paths:
            if not os.path.exists(p):
                continue
            real = os.path.realpath(p)
            hits = [] if denied is None else denied.match(p) or denied.match(real)
            if hits:
                assert denied is not None
                (masks.dirs if os.path.isdir(real) else masks.files).append(real)
                details.append(f"  baseline {label}: {p} DENIED by {denied.patterns[hits[0]]}: masked, not granted")
                continue
            grants.append((real, rights))
            details.append(f"  baseline {label}: {p}")
            if os.path.isdir(real):
                directories.append(real)
    if baseline.proc_self:
        details.append("  baseline read: /proc/self (the agent's own /proc entry, resolved in the child)")
    if denied is not None:
        details.extend(_baseline_masks(denied, directories, cwd, home, masks))
    return BaselinePart(grants, masks, details)


def filesystem(fs: Any, base: BaselinePart, cwd: str, home: str, abi: int) -> FilesystemPart:
    """The declared grants: each pattern's literal prefix, when it exists (Landlock grants whole trees).
    The layer lists them, then the baseline's."""
    layer = Layer("filesystem", f"Landlock ABI {abi}" if abi else "Landlock", "active")
    grants: Grants = []
    writable: list[str] = []
    if fs is None:
        layer.details.append("no filesystem permission declared: only the runtime baseline is reachable")
    else:
        for pattern, access in zip(fs.allowed.patterns, fs.access, strict=True):
            prefix = literal_prefix(pattern, cwd, home)
            rights = {"read": landlock.READ, "write": landlock.WRITE, "read_write": landlock.READ | landlock.WRITE}[
                access
            ]
            if not os.path.exists(prefix):
                layer.details.append(f"{access:<10} {pattern}: {prefix} does not exist, nothing granted")
                continue
            grants.append((prefix, rights))
            if access != "read":
                writable.append(os.path.realpath(prefix))
            narrower = "" if pattern.rstrip("/") in (prefix, prefix + "/**") else f" (Landlock grants all of {prefix})"
            layer.details.append(f"{access:<10} {pattern}{narrower}")
    layer.details.extend(base.details)
    return FilesystemPart(grants, writable, layer)


def execution(
    policy: Policy, argv: list[str], baseline: Baseline, cwd: str, writable: list[str], abi: int
) -> ExecutionPart:
    """The command resolved and checked, every binary the policy allows, and what stays executable."""
    search_path = baseline.search_path
    executable = _resolve(argv[0], search_path, cwd)
    if executable is None:
        raise PlanError(f"command not found: {argv[0]} (searched {search_path})")
    granted = _executables(policy, search_path, executable)
    if os.path.realpath(executable) not in granted:
        verdict = decide(policy, ProcessExec(tuple(argv), executable))
        reason = verdict.reasons[0].text if verdict.reasons else "not allowed"
        raise PlanError(f"the command itself is not allowed: {reason}")
    mounts, notes = _exec_mounts(baseline, granted, writable)
    layer = Layer("execution", f"Landlock EXECUTE (ABI {abi}) + noexec mounts", "active", notes)
    if policy.execution is None:
        layer.details.append(f"no execution permission declared: only {executable} may run")
    else:
        shells = "allowed" if policy.execution.allow_shell else "never executable"
        layer.details.append(f"executable: {', '.join(sorted(granted))}; shells {shells}")
    layer.details.extend(mounts.describe())
    grants = [(binary, landlock.READ_FILE | landlock.EXECUTE) for binary in sorted(granted)]
    return ExecutionPart(executable, grants, mounts, layer)


def environment(policy: Policy, environ: dict[str, str], search_path: str) -> EnvironmentPart:
    """An empty environment plus the allowed names; PATH is the baseline's unless allowed through."""
    env: dict[str, str] = {}
    dropped: list[str] = []
    for name in sorted(environ):
        if decide(policy, EnvVar(name)).allowed:
            env[name] = environ[name]
        else:
            dropped.append(name)
    env.setdefault("PATH", search_path)
    secrets = [env[n] for n in policy.secret_env if n in env]
    layer = Layer("environment", "empty start, allowed names only", "active")
    layer.details.append(f"passed: {', '.join(sorted(env)) or 'nothing'}")
    if dropped:
        layer.details.append(f"dropped: {', '.join(dropped)}")
    return EnvironmentPart(env, dropped, secrets, layer)


def network(
    policy: Policy, tools_missing: tuple[str, ...], egress: EgressValues | Callable[[], EgressValues] | None
) -> NetworkPart:
    """No declared host: an empty namespace. Declared hosts: the egress filter, with `egress` (or what
    it loads; None: the defaults); without the filter's tools, loopback only."""
    net = policy.network
    if net is None or not net.hosts.patterns:
        return NetworkPart(Layer("network", "new network namespace", "active", ["loopback only: nothing leaves"]), None)
    layer = Layer("network", "network namespace + egress host filter", "active", _network_details(policy))
    if tools_missing:
        layer.details = [f"declared hosts {', '.join(net.hosts.patterns)} are NOT reachable: loopback only"]
        missing = f"the egress filter needs {', '.join(tools_missing)}, not installed here"
        return NetworkPart(layer, None, missing)
    settings = _egress_settings(egress)
    layer.details.append("Landlock: no TCP listening; every TCP connect goes to the filter")
    resolver = settings.resolver()
    layer.details.append(
        "upstream resolver: " + ("{}:{}".format(*resolver) if resolver else "none configured: names fail")
    )
    if settings.public_test_ranges:
        layer.details.append(f"public test ranges (audited): {', '.join(settings.public_test_ranges)}")
    return NetworkPart(layer, settings)


def syscalls(creation_denied: creation_guard.DeniedNames | None) -> tuple[SeccompPlan, Layer]:
    """The seccomp filter, with the creation guard for denied names and for metadata changes in
    writable grants when there are any."""
    plan = SeccompPlan(
        guard_creation=creation_denied is not None and bool(creation_denied.patterns),
        guard_metadata=creation_denied is not None,
    )
    return plan, Layer("syscalls", "seccomp (default allow, escape surface denied)", "active", seccomp.describe(plan))


def privileges() -> Layer:
    return Layer(
        "privileges",
        "never host root, no capabilities, no_new_privs, new session, private mounts",
        "active",
        [
            "identity: --user, else the sudo caller, else the daemon's caller (uid or gid 0 refused)",
            "own PID namespace under an init; own /proc (hidepid=2), its mount tables masked",
            "own IPC namespace: no System V or POSIX message queue, semaphore or shared memory of the "
            "host or another session",
        ],
    )


def resources(policy: Policy, cgroups: str, pids_max: int) -> ResourcesPart:
    """The cgroup limits and the wall clock; without a usable cgroup hierarchy, none is enforced."""
    lim = policy.limits
    limits = Limits(
        memory_bytes=int(lim.max_memory_mb * 1024 * 1024) if lim and lim.max_memory_mb else None,
        cpu_percent=lim.max_cpu_percent if lim and lim.max_cpu_percent else None,
        pids_max=pids_max,
    )
    timeout_s = lim.max_duration_sec if lim and lim.max_duration_sec else None
    layer = Layer("resources", f"cgroup {cgroups}", "active")
    layer.details.append(
        f"memory {limits.memory_bytes // 1048576 if limits.memory_bytes else 'unlimited'} MB, "
        f"cpu {limits.cpu_percent or 'unlimited'}%, pids {pids_max}, "
        f"wall clock {timeout_s or 'unlimited'} s"
    )
    missing = "no usable cgroup hierarchy (memory, cpu, pids)" if cgroups == "none" else None
    return ResourcesPart(limits, timeout_s, layer, missing)


def residual(policy: Policy) -> tuple[list[str], Layer]:
    """Known gaps, stated precisely rather than left implicit: in the evidence and in their own layer."""
    gaps = [
        "name probing: path lookup, stat, access and readlink are not Landlock rights; the agent can learn "
        "whether a path outside its grants exists and read its metadata (never its content)",
    ]
    fs = policy.filesystem
    if fs is not None and fs.denied.patterns:
        gaps.append(
            "late host files: a file matching denied_paths that another process creates inside a readable "
            "grant after launch is readable (masks are made at launch, Landlock rules cannot match names; "
            "the agent's own creations are refused by the creation guard)"
        )
    gaps.append(
        "an allowed interpreter runs any code it is given (python -c, ctypes); anonymous executable memory "
        "(JIT compilers) is not a mount and stays possible"
    )
    gaps.append(
        "advisory locks: the agent can hold flock, fcntl and open-file-description locks on files it may "
        "read, its grants' and the baseline's (no Landlock or seccomp right tells them from its own files); "
        "a host process that waits for such a lock waits until the session ends (leases are refused: they "
        "need the file's owner)"
    )
    return gaps, Layer(
        "not covered", "what no layer closes on this kernel (also in the evidence)", "unavailable", list(gaps)
    )


def _egress_settings(given: EgressValues | Callable[[], EgressValues] | None) -> EgressValues:
    from ..egress_values import EgressValues

    if given is None:
        return EgressValues()
    if isinstance(given, EgressValues):
        return given
    try:
        return given()
    except ValueError as exc:  # settings.launch.SettingsError: the message names the variables
        raise PlanError(f"egress settings: {exc}") from None


def _network_details(policy: Policy) -> list[str]:
    net = policy.network
    assert net is not None
    ports = ", ".join(map(str, sorted(net.ports))) if net.ports is not None else "from protocols"
    protocols = ", ".join(sorted(net.protocols)) if net.protocols is not None else "any"
    private = "denied" if net.deny_private else "allowed (deny_private: false)"
    details = [
        "capture (nftables in the agent's namespace): every TCP connection to the filter, DNS (UDP/TCP 53) "
        "to the stub; other UDP and QUIC dropped and counted",
        f"hosts: {', '.join(net.hosts.patterns)} (other names: NXDOMAIN, never sent upstream)",
        f"ports: {ports}; protocols: {protocols}",
        f"private, loopback, link-local and host addresses: {private}; metadata addresses: always denied",
        "TLS SNI and HTTP Host must match the name connected to; the filter dials the address it checked",
    ]
    for r in policy.residency:
        source = "AAIF data_residency" if r.document == "aaif" else "ADL cross_border_restricted"
        details.append(f"residency: {r.region} ({source}); hosts of unknown region denied")
    return details


def _creation_matcher(fs: Any, writable: list[str]) -> creation_guard.DeniedNames | None:
    """What the guard applies: denied patterns to new names, writable grants to metadata changes.
    None without a writable grant: Landlock forbids creating files and seccomp every metadata change."""
    if fs is None or not writable:
        return None
    from . import creation_guard  # only plans with a guard (or masks to compute) load it

    return creation_guard.DeniedNames(fs.denied, tuple(writable))


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _baseline_masks(denied: PatternList, roots: list[str], cwd: str, home: str, masks: Masks) -> list[str]:
    """Mask what a denied pattern matches inside the baseline's directories. Each walk starts at the
    deepest literal directory the pattern and the baseline directory share; a pattern that would need
    more than MAX_MASK_WALK entries checked refuses the launch rather than leave matches readable."""
    from . import creation_guard  # called only for a policy with denied patterns

    details: list[str] = []
    masked = set(masks.files) | set(masks.dirs)
    for pattern in denied.patterns:
        single = creation_guard.DeniedNames(PatternList.compile([pattern], "path"))
        prefix = literal_prefix(pattern, cwd, home)
        for root in roots:
            if _beneath(prefix, root):
                start = prefix
            elif _beneath(root, prefix) and single.may_match_beneath(root):
                start = root
            else:
                continue
            if not os.path.isdir(start):
                continue
            visited = 0
            for directory, subdirs, files in os.walk(start, followlinks=False):
                for name in list(subdirs) + files:
                    visited += 1
                    full = os.path.join(directory, name)
                    if single(full) is None:
                        if name in subdirs and not single.may_match_beneath(full):
                            subdirs.remove(name)  # nothing below can match: not walked
                        continue
                    if full in masked:
                        continue
                    masked.add(full)
                    if name in subdirs:
                        masks.dirs.append(full)
                        subdirs.remove(name)
                    elif os.path.isfile(full) and not os.path.islink(full):
                        masks.files.append(full)
                    details.append(f"  baseline {root}: {full} DENIED by {pattern}: masked")
                if visited > MAX_MASK_WALK:
                    raise PlanError(
                        f"denied pattern {pattern!r} may match files inside the runtime baseline's {root}: more "
                        f"than {MAX_MASK_WALK} entries to check; narrow the pattern (deny wins over the baseline)"
                    )
    return details


def _exec_mounts(baseline: Baseline, granted: set[str], writable: list[str]) -> tuple[ExecMounts, list[str]]:
    """Every mount noexec except the allowed executables, the ELF interpreter and the baseline's
    library directories; writable grants stay noexec even inside them. With the library directories
    left noexec for that reason."""
    for binary in sorted(granted):
        for root in writable:
            if _beneath(binary, root):
                raise PlanError(
                    f"allowed command {binary} lies in the writable grant {root}: the agent could replace it with "
                    "code of its own (writable grants are never executable)"
                )
    files = sorted(granted | {os.path.realpath(p) for p in baseline.execute if os.path.exists(p)})
    directories: list[str] = []
    trees: list[str] = []
    notes: list[str] = []
    for wanted, kept in ((baseline.library, directories), (baseline.library_trees, trees)):
        for path in wanted:
            if any(_beneath(path, root) for root in writable):
                notes.append(f"library {path} lies in a writable grant: noexec")
                continue
            kept.append(path)
    exec_paths = set(files) | set(directories) | set(trees)
    noexec: list[str] = []

    def subdirectories(directory: str) -> None:
        """Only the top level of a library directory is code: its subdirectories are noexec again,
        except where a listed path lies beneath (then one level further down)."""
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False) or entry.path in exec_paths:
                    continue
                path = entry.path
                if any(_beneath(p, path) for p in exec_paths):
                    subdirectories(path)
                else:
                    noexec.append(path)

    for directory in directories:
        subdirectories(directory)
    noexec += [root for root in writable if any(_beneath(root, p) for p in directories + trees)]
    mounts = ExecMounts(
        files=files, directories=sorted(directories, key=len), trees=sorted(trees, key=len), noexec=sorted(noexec)
    )
    return mounts, notes


def _resolve(command: str, search_path: str, cwd: str) -> str | None:
    if "/" in command:
        path = command if command.startswith("/") else os.path.join(cwd, command)
        return path if os.access(path, os.X_OK) else None
    for directory in search_path.split(":"):
        candidate = os.path.join(directory, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _executables(policy: Policy, search_path: str, launched: str) -> set[str]:
    """Real paths of every binary the policy lets the agent execute (PATH expanded at launch)."""
    rules = policy.execution
    if rules is None:
        return {os.path.realpath(launched)}
    granted: set[str] = set()
    seen: set[str] = set()
    directories = [d for d in search_path.split(":") if os.path.isdir(d)]
    candidates = [launched]
    for pattern in rules.allowed.patterns:
        if pattern.startswith("/"):
            candidates.append(pattern)
        elif GLOB_CHARS & set(pattern):  # list PATH directories only for glob patterns
            candidates += [
                os.path.join(d, n)
                for d in directories
                for n in sorted(os.listdir(d))
                if rules.allowed.first(n) is not None
            ]
        else:
            candidates += [os.path.join(d, pattern) for d in directories]
    for path in candidates:
        if path in seen or not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        seen.add(path)
        real = os.path.realpath(path)
        if not rules.allow_shell and os.path.basename(real) in SHELLS:
            continue  # `sh` linked to dash is still a shell
        if decide(policy, ProcessExec((os.path.basename(path),), path)).allowed:
            granted.add(real)
    return granted


def denied_masks(fs: Any, cwd: str, home: str, baseline: Masks, *, guarded: bool) -> tuple[Layer, Masks]:
    """Every denied file and directory inside the declared grants, added to the baseline's masks. A
    hard link is the same file under another name: every name of a denied file is masked."""
    layer = Layer("denied_paths", "mount namespace masks", "active")
    masks = Masks(list(baseline.files), list(baseline.dirs))
    if not fs.denied.patterns:
        layer.status = "not declared"
        return layer, masks
    visited = 0
    # Walked by their real paths: Landlock grants what a link points to, and masks are mounted there.
    roots = sorted({os.path.realpath(literal_prefix(p, cwd, home)) for p in fs.allowed.patterns})
    denied_inodes: set[tuple[int, int]] = set()
    regular_files: list[tuple[str, os.stat_result]] = []
    for root in roots:
        for directory, subdirs, files in os.walk(root, followlinks=False):
            for name in list(subdirs) + files:
                visited += 1
                full = os.path.join(directory, name)
                info = os.lstat(full)
                denied = fs.denied.first(full) is not None
                if stat.S_ISDIR(info.st_mode) and denied:
                    masks.dirs.append(full)
                    subdirs.remove(name)
                elif stat.S_ISREG(info.st_mode):
                    regular_files.append((full, info))
                    if denied:
                        denied_inodes.add((info.st_dev, info.st_ino))
            if visited > MAX_MASK_WALK:
                raise PlanError(f"more than {MAX_MASK_WALK} entries under {root} while looking for denied paths")
    masks.files.extend(full for full, info in regular_files if (info.st_dev, info.st_ino) in denied_inodes)
    layer.details.append(f"patterns: {', '.join(fs.denied.patterns)}")
    layer.details.append(f"masked at launch: {len(masks.files)} file(s), {len(masks.dirs)} directorie(s)")
    layer.details.extend(f"  masked: {p}" for p in masks.files + masks.dirs)
    if guarded:
        layer.details.append(
            "created after launch: every name-creating call (open with O_CREAT, mkdir, mknod, link, "
            "symlink, rename) is checked by the creation guard, with the agent's rights, against these "
            "patterns and refused (EACCES, audited) when the new name matches, when a renamed or exchanged "
            "directory brings a matching name along, or when a symbolic link is named by a pattern's own segment"
        )
    else:
        layer.details.append("created after launch: nothing can be created (no writable grant)")
    return layer, masks
