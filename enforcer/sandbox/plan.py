"""From a compiled Policy and a command to a launch plan: every kernel rule, mask, variable and limit
the child will apply, decided in the parent where errors can still be reported cleanly. Reads the
filesystem (PATH lookups, which paths exist, denied files to mask) but changes nothing.

Every grant is decided by the same decide() the API uses, so `adl-policy check` and the sandbox
cannot disagree about what a pattern means.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..policy import EnvVar, Policy, ProcessExec, decide
from ..policy.decider import SHELLS
from ..policy.errors import Refusal
from ..policy.patterns import PatternList
from . import DOMAINS, creation_guard, landlock, seccomp
from .cgroups import Limits
from .execmounts import ExecMounts
from .seccomp import SeccompPlan

if TYPE_CHECKING:  # pydantic-settings is slow to import: only plans with a network layer load it
    from ..egress_settings import EgressSettings

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
    from ruamel.yaml import YAML  # only when the baseline is not in the policy cache

    raw = path.read_bytes()
    data: Any = YAML(typ="safe").load(raw) or {}

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
    egress: EgressSettings | None = None  # None: an empty network namespace, nothing leaves
    exec_mounts: ExecMounts | None = None  # what stays executable; every other mount is noexec
    residual: list[str] = field(default_factory=list)  # what this kernel cannot close: explained and in the evidence


@dataclass(frozen=True)
class HostFeatures:
    landlock_abi: int
    cgroups: str  # v2 | v1 | none
    egress_tools_missing: tuple[str, ...] = ()  # programs the egress filter needs (nft, ip) not installed


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
    egress: EgressSettings | None = None,
) -> LaunchPlan:
    """Raises PlanError for anything that must be refused; with explain_only, layers that cannot be
    enforced are reported as unavailable (and in `refusals`) instead."""
    unknown = accept_unenforced - set(DOMAINS)
    if unknown:
        raise PlanError(f"--accept-unenforced takes {', '.join(DOMAINS)}; not {', '.join(sorted(unknown))}")
    if policy.lifecycle.verdict == "refuse":
        raise PlanError(f"lifecycle: {policy.lifecycle.reason}")
    if policy.signature == "invalid":
        raise PlanError("the document's signature does not verify")
    if not argv:
        raise PlanError("no command given (adl-exec --adl FILE -- COMMAND ARGS...)")
    cwd = cwd or os.getcwd()
    home = environ.get("HOME", "/")
    layers: list[Layer] = []
    accepted: list[str] = []

    refusals: list[str] = []

    def unenforceable(domain: str, what: str) -> LayerStatus:
        """A layer this host cannot enforce: refused, unless accepted (or only being explained)."""
        if domain in accept_unenforced:
            accepted.append(domain)
            return "accepted-unenforced"
        refusal = f"{what}; refusing to run with '{domain}' unenforced (--accept-unenforced {domain} to accept)"
        if not explain_only:
            raise PlanError(refusal)
        refusals.append(refusal)
        return "unavailable"

    abi = features.landlock_abi
    ll = landlock.LandlockPlan(abi)
    fs_layer = Layer("filesystem", f"Landlock ABI {abi}" if abi else "Landlock", "active")
    exec_layer = Layer("execution", f"Landlock EXECUTE (ABI {abi})", "active")
    if abi == 0:
        fs_layer.status = unenforceable("filesystem", "Landlock is not available on this kernel")
        exec_layer.status = unenforceable("execution", "Landlock is not available on this kernel")

    # -- runtime baseline (a denied pattern wins over it: what it matches is masked, not granted)
    fs = policy.filesystem
    denied = fs.denied if fs is not None and fs.denied.patterns else None
    file_masks: list[str] = []
    dir_masks: list[str] = []
    search_path = baseline.search_path
    base_details = [f"baseline {baseline.path} ({baseline.digest[:19]}…)"]
    baseline_dirs: list[str] = []
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
                (dir_masks if os.path.isdir(real) else file_masks).append(real)
                pattern = denied.patterns[hits[0]]  # type: ignore[union-attr]
                base_details.append(f"  baseline {label}: {p} DENIED by {pattern}: masked, not granted")
                continue
            ll.add(real, rights)
            base_details.append(f"  baseline {label}: {p}")
            if os.path.isdir(real):
                baseline_dirs.append(real)
    if baseline.proc_self:
        base_details.append("  baseline read: /proc/self (the agent's own /proc entry, resolved in the child)")
    if denied is not None:
        base_details.extend(_baseline_masks(denied, baseline_dirs, cwd, home, file_masks, dir_masks))

    # -- filesystem
    writable: list[str] = []
    creation_denied = None
    if fs is None:
        fs_layer.details.append("no filesystem permission declared: only the runtime baseline is reachable")
    else:
        for pattern, access in zip(fs.allowed.patterns, fs.access, strict=True):
            prefix = literal_prefix(pattern, cwd, home)
            rights = {"read": landlock.READ, "write": landlock.WRITE, "read_write": landlock.READ | landlock.WRITE}[
                access
            ]
            if not os.path.exists(prefix):
                fs_layer.details.append(f"{access:<10} {pattern}: {prefix} does not exist, nothing granted")
                continue
            ll.add(prefix, rights)
            if access != "read":
                writable.append(os.path.realpath(prefix))
            narrower = "" if pattern.rstrip("/") in (prefix, prefix + "/**") else f" (Landlock grants all of {prefix})"
            fs_layer.details.append(f"{access:<10} {pattern}{narrower}")
        creation_denied = _creation_matcher(fs, writable)
        masks_layer = _denied_masks(
            fs, cwd, home, file_masks, dir_masks, guarded=creation_denied is not None and bool(fs.denied.patterns)
        )
        layers.append(masks_layer)
    fs_layer.details.extend(base_details)
    layers.insert(0, fs_layer)

    # -- execution
    executable = _resolve(argv[0], search_path, cwd)
    if executable is None:
        raise PlanError(f"command not found: {argv[0]} (searched {search_path})")
    granted = _executables(policy, search_path, executable)
    if os.path.realpath(executable) not in granted:
        verdict = decide(policy, ProcessExec(tuple(argv), executable))
        reason = verdict.reasons[0].text if verdict.reasons else "not allowed"
        raise PlanError(f"the command itself is not allowed: {reason}")
    for binary in sorted(granted):
        ll.add(binary, landlock.READ_FILE | landlock.EXECUTE)
    exec_mounts = _exec_mounts(baseline, granted, writable, exec_layer)
    if policy.execution is None:
        exec_layer.details.append(f"no execution permission declared: only {executable} may run")
    else:
        shells = "allowed" if policy.execution.allow_shell else "never executable"
        exec_layer.details.append(f"executable: {', '.join(sorted(granted))}; shells {shells}")
    exec_layer.mechanism += " + noexec mounts"
    exec_layer.details.extend(exec_mounts.describe())
    layers.insert(1, exec_layer)

    # -- environment
    env, dropped, secrets = _environment(policy, environ, search_path)
    env_layer = Layer("environment", "empty start, allowed names only", "active")
    env_layer.details.append(f"passed: {', '.join(sorted(env)) or 'nothing'}")
    if dropped:
        env_layer.details.append(f"dropped: {', '.join(dropped)}")
    layers.append(env_layer)

    # -- network
    net = policy.network
    egress_settings = None
    if net is None or not net.hosts.patterns:
        layers.append(Layer("network", "new network namespace", "active", ["loopback only: nothing leaves"]))
    else:
        net_layer = Layer("network", "network namespace + egress host filter", "active", _network_details(policy))
        if features.egress_tools_missing:
            missing = ", ".join(features.egress_tools_missing)
            net_layer.status = unenforceable("network", f"the egress filter needs {missing}, not installed here")
            net_layer.details = [f"declared hosts {', '.join(net.hosts.patterns)} are NOT reachable: loopback only"]
        else:
            egress_settings = egress or _egress_from_environment()
            # The capture sends every connect to the filter, which decides and audits it; a Landlock
            # port rule would refuse some attempts earlier but leave them out of the audit log.
            ll.deny_tcp_connect = False
            net_layer.details.append("Landlock: no TCP listening; every TCP connect goes to the filter")
            resolver = egress_settings.resolver()
            net_layer.details.append(
                "upstream resolver: " + ("{}:{}".format(*resolver) if resolver else "none configured: names fail")
            )
            if egress_settings.public_test_ranges:
                net_layer.details.append(
                    f"public test ranges (audited): {', '.join(egress_settings.public_test_ranges)}"
                )
        layers.append(net_layer)

    # -- syscalls and privileges
    seccomp_plan = SeccompPlan(
        guard_creation=creation_denied is not None and bool(creation_denied.patterns),
        guard_metadata=creation_denied is not None,
    )
    layers.append(
        Layer("syscalls", "seccomp (default allow, escape surface denied)", "active", seccomp.describe(seccomp_plan))
    )
    layers.append(
        Layer(
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
    )
    residual = _residual(policy)
    layers.append(Layer("not covered", "what no layer closes on this kernel (also in the evidence)", "unavailable"))
    layers[-1].details.extend(residual)

    # -- resources
    lim = policy.limits
    limits = Limits(
        memory_bytes=int(lim.max_memory_mb * 1024 * 1024) if lim and lim.max_memory_mb else None,
        cpu_percent=lim.max_cpu_percent if lim and lim.max_cpu_percent else None,
        pids_max=pids_max,
    )
    res = Layer("resources", f"cgroup {features.cgroups}", "active")
    if features.cgroups == "none":
        res.status = unenforceable("resources", "no usable cgroup hierarchy (memory, cpu, pids)")
    res.details.append(
        f"memory {limits.memory_bytes // 1048576 if limits.memory_bytes else 'unlimited'} MB, "
        f"cpu {limits.cpu_percent or 'unlimited'}%, pids {pids_max}, "
        f"wall clock {lim.max_duration_sec if lim and lim.max_duration_sec else 'unlimited'} s"
    )
    layers.append(res)
    return LaunchPlan(
        argv=list(argv),
        executable=executable,
        env=env,
        env_dropped=dropped,
        landlock=ll,
        file_masks=file_masks,
        dir_masks=dir_masks,
        seccomp=seccomp_plan,
        limits=limits,
        timeout_s=lim.max_duration_sec if lim and lim.max_duration_sec else None,
        layers=layers,
        accepted_unenforced=accepted,
        baseline=baseline,
        secrets=secrets,
        refusals=refusals,
        creation_denied=creation_denied,
        egress=egress_settings,
        exec_mounts=exec_mounts,
        residual=residual,
    )


def _residual(policy: Policy) -> list[str]:
    """Known gaps, stated precisely rather than left implicit."""
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
    return gaps


def _egress_from_environment() -> EgressSettings:
    from pydantic import ValidationError

    from ..egress_settings import EgressSettings

    try:
        return EgressSettings()
    except ValidationError as exc:
        problems = "; ".join(f"ADL_ENFORCER_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        raise PlanError(f"egress settings: {problems}") from None


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
    return creation_guard.DeniedNames(fs.denied, tuple(writable))


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _baseline_masks(
    denied: Any, roots: list[str], cwd: str, home: str, file_masks: list[str], dir_masks: list[str]
) -> list[str]:
    """Mask what a denied pattern matches inside the baseline's directories. Each walk starts at the
    deepest literal directory the pattern and the baseline directory share; a pattern that would need
    more than MAX_MASK_WALK entries checked refuses the launch rather than leave matches readable."""
    details: list[str] = []
    masked = set(file_masks) | set(dir_masks)
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
                        dir_masks.append(full)
                        subdirs.remove(name)
                    elif os.path.isfile(full) and not os.path.islink(full):
                        file_masks.append(full)
                    details.append(f"  baseline {root}: {full} DENIED by {pattern}: masked")
                if visited > MAX_MASK_WALK:
                    raise PlanError(
                        f"denied pattern {pattern!r} may match files inside the runtime baseline's {root}: more "
                        f"than {MAX_MASK_WALK} entries to check; narrow the pattern (deny wins over the baseline)"
                    )
    return details


def _exec_mounts(baseline: Baseline, granted: set[str], writable: list[str], layer: Layer) -> ExecMounts:
    """Every mount noexec except the allowed executables, the ELF interpreter and the baseline's
    library directories; writable grants stay noexec even inside them."""
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
    for wanted, kept in ((baseline.library, directories), (baseline.library_trees, trees)):
        for path in wanted:
            if any(_beneath(path, root) for root in writable):
                layer.details.append(f"library {path} lies in a writable grant: noexec")
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
    return ExecMounts(
        files=files, directories=sorted(directories, key=len), trees=sorted(trees, key=len), noexec=sorted(noexec)
    )


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


def _environment(
    policy: Policy, environ: dict[str, str], search_path: str
) -> tuple[dict[str, str], list[str], list[str]]:
    env: dict[str, str] = {}
    dropped: list[str] = []
    for name in sorted(environ):
        if decide(policy, EnvVar(name)).allowed:
            env[name] = environ[name]
        else:
            dropped.append(name)
    env.setdefault("PATH", search_path)
    secrets = [env[n] for n in policy.secret_env if n in env]
    return env, dropped, secrets


def _denied_masks(fs: Any, cwd: str, home: str, file_masks: list[str], dir_masks: list[str], *, guarded: bool) -> Layer:
    layer = Layer("denied_paths", "mount namespace masks", "active")
    if not fs.denied.patterns:
        layer.status = "not declared"
        return layer
    visited = 0
    roots = sorted({literal_prefix(p, cwd, home) for p in fs.allowed.patterns})
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
                    dir_masks.append(full)
                    subdirs.remove(name)
                elif stat.S_ISREG(info.st_mode):
                    regular_files.append((full, info))
                    if denied:
                        denied_inodes.add((info.st_dev, info.st_ino))
            if visited > MAX_MASK_WALK:
                raise PlanError(f"more than {MAX_MASK_WALK} entries under {root} while looking for denied paths")
    # A hard link is the same file under another name: mask every name of a denied file.
    file_masks.extend(full for full, info in regular_files if (info.st_dev, info.st_ino) in denied_inodes)
    layer.details.append(f"patterns: {', '.join(fs.denied.patterns)}")
    layer.details.append(f"masked at launch: {len(file_masks)} file(s), {len(dir_masks)} directorie(s)")
    layer.details.extend(f"  masked: {p}" for p in file_masks + dir_masks)
    if guarded:
        layer.details.append(
            "created after launch: every name-creating call (open with O_CREAT, mkdir, mknod, link, "
            "symlink, rename) is checked by the creation guard, with the agent's rights, against these "
            "patterns and refused (EACCES, audited) when the new name matches, when a renamed or exchanged "
            "directory brings a matching name along, or when a symbolic link is named by a pattern's own segment"
        )
    else:
        layer.details.append("created after launch: nothing can be created (no writable grant)")
    return layer
