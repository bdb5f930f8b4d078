"""One cgroup per session: memory, CPU quota and pids limits, membership, kill, outcome counters.

cgroup v2 (the norm) and v1 (these machines: memory/cpu/pids on v1, cgroup2 mounted at
/sys/fs/cgroup/unified with only kill/freeze/events) sit behind one interface, chosen at run time.
Sessions are created below the enforcer's own cgroup in each hierarchy, so limits imposed on the
enforcer still bind its agents.

On a pure v2 host a delegated cgroup (systemd's Delegate=yes) cannot both hold the daemon's
processes and give controllers to the session groups below it ("no internal processes"), so at
start adl-enforcerd moves its processes into the leaf <own>/daemon (place_in_leaf) and the session
groups are made beside that leaf. systemd 254's `DelegateSubgroup=daemon` starts it there already.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from abc import ABC, abstractmethod
from pathlib import Path

from ..quick_dataclass import dataclass
from . import guardian

CPU_PERIOD_US = 100_000
GROUP = "adl-enforcer"
LEAF = "daemon"  # v2: the daemon's own processes, beside its session groups
CONTROLLERS = ("memory", "cpu", "pids")


class CgroupError(OSError):
    pass


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = None
    cpu_percent: float | None = None  # of one CPU, may exceed 100
    pids_max: int | None = None


@dataclass(frozen=True)
class Counters:
    oom_kills: int
    pids_max_hits: int


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_keyed(path: Path) -> dict[str, int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """Controller (or '' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


class Cgroup(ABC):
    """A session's cgroup. `directories` are where its member processes are written."""

    version: int

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories

    @abstractmethod
    def apply(self, limits: Limits) -> None: ...

    @abstractmethod
    def counters(self) -> Counters: ...

    @abstractmethod
    def pids_directory(self) -> Path:
        """The directory whose pids.max bounds this cgroup's tasks."""

    def members(self) -> list[int]:
        pids: set[int] = set()
        for d in self.directories:
            try:
                # 0 stands for a member outside this PID namespace: kill(0) would hit our own group.
                pids.update(pid for pid in map(int, (d / "cgroup.procs").read_text().split()) if pid > 0)
            except FileNotFoundError:
                continue
        return sorted(pids)

    def join_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.directories]

    @abstractmethod
    def kill_all(self) -> None:
        """SIGKILL every member, double-forked ones included."""

    @abstractmethod
    def kill_files(self) -> list[str]:
        """The cgroup.kill file kill_all writes when it exists (the guardian kills the same way)."""

    def remove(self, timeout: float = 5.0) -> None:
        """Kill what is left, wait for it to go, remove the directories (bounded wait): the
        guardian's loop (guardian.empty_and_remove), through this group's members and kill."""
        guardian.empty_and_remove(self.directories, self.members, self.kill_all, timeout, CgroupError)


class CgroupV2(Cgroup):
    version = 2

    def __init__(self, directory: Path) -> None:
        super().__init__([directory])
        self.path = directory

    def pids_directory(self) -> Path:
        return self.path

    def apply(self, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            self._set("memory", "memory.max", str(limits.memory_bytes))
            self._set("memory", "memory.swap.max", "0")
        if limits.cpu_percent is not None:
            quota = max(int(CPU_PERIOD_US * limits.cpu_percent / 100), 1000)
            self._set("cpu", "cpu.max", f"{quota} {CPU_PERIOD_US}")
        if limits.pids_max is not None:
            self._set("pids", "pids.max", str(limits.pids_max))

    def _set(self, controller: str, name: str, value: str) -> None:
        try:
            _write(self.path / name, value)
        except OSError as exc:  # cgroupfs answers EACCES, not ENOENT, for a file it does not have
            if (self.path / name).exists() or controller in _controllers(self.path):
                raise
            raise CgroupError(
                errno.ENOTSUP,
                f"the {controller} controller is not enabled for {self.path}, so the policy's limit cannot be set: "
                f"on cgroup v2 the enforcer needs a cgroup delegated to it with {controller} "
                "(systemd: Delegate=yes in its unit, see docs/install.md)",
            ) from exc

    def counters(self) -> Counters:
        return Counters(
            _read_keyed(self.path / "memory.events").get("oom_kill", 0),
            _read_keyed(self.path / "pids.events").get("max", 0),
        )

    def kill_files(self) -> list[str]:
        return [str(self.path / "cgroup.kill")]

    def kill_all(self) -> None:
        try:
            _write(self.path / "cgroup.kill", "1")
        except FileNotFoundError:  # kernels before 5.14
            for pid in self.members():
                _kill(pid)


class CgroupV1(Cgroup):
    """memory, cpu and pids hierarchies, plus the cgroup2 `unified` mount for kill when present."""

    version = 1

    def __init__(self, memory: Path, cpu: Path, pids: Path, unified: Path | None) -> None:
        super().__init__([d for d in (memory, cpu, pids, unified) if d is not None])
        self.memory, self.cpu, self.pids, self.unified = memory, cpu, pids, unified

    def pids_directory(self) -> Path:
        return self.pids

    def apply(self, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            _write(self.memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            swap = self.memory / "memory.memsw.limit_in_bytes"
            if swap.exists():
                _write(swap, str(limits.memory_bytes))
        if limits.cpu_percent is not None:
            _write(self.cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(self.cpu / "cpu.cfs_quota_us", str(max(int(CPU_PERIOD_US * limits.cpu_percent / 100), 1000)))
        if limits.pids_max is not None:
            _write(self.pids / "pids.max", str(limits.pids_max))

    def counters(self) -> Counters:
        oom = _read_keyed(self.memory / "memory.oom_control").get("oom_kill", 0)
        return Counters(oom, _read_keyed(self.pids / "pids.events").get("max", 0))

    def kill_files(self) -> list[str]:
        return [str(self.unified / "cgroup.kill")] if self.unified is not None else []

    def kill_all(self) -> None:
        if self.unified is not None and (self.unified / "cgroup.kill").exists():
            _write(self.unified / "cgroup.kill", "1")
            return
        for pid in self.members():
            _kill(pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def host_tasks() -> int:
    """The tasks the host can have at once: kernel.pid_max or kernel.threads-max, the lower."""
    return min(int(Path(f"/proc/sys/kernel/{name}").read_text()) for name in ("pid_max", "threads-max"))


def bound_siblings(group: Cgroup, tasks: int) -> None:
    """Bound the tasks of `group` and every group beside it together (pids.max of the directory
    that holds them): each session's own limit bounds one session, not how many run."""
    _write(group.pids_directory().parent / "pids.max", str(tasks))


def detect(root: Path = Path("/sys/fs/cgroup")) -> str:
    """'v2', 'v1' or 'none' (nothing usable)."""
    controllers = root / "cgroup.controllers"
    if controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split()):
        return "v2"
    if all((root / c / "cgroup.procs").exists() for c in ("memory", "cpu", "pids")):
        return "v1"
    return "none"


def _session_dirs(
    session: str, root: Path, group: str, proc_cgroup: str | None
) -> tuple[str, Path | None, list[Path], Path | None]:
    """(kind, v2 directory, v1 memory/cpu/pids directories, v1 unified directory) of one session,
    below this process's own cgroup in each hierarchy."""
    own = _own_paths(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    kind = detect(root)
    if kind == "v2":
        return kind, _v2_base(root, own.get("", "/")) / group / session, [], None
    if kind == "v1":
        v1 = [root / c / own.get(c, "/").lstrip("/") / group / session for c in ("memory", "cpu", "pids")]
        unified = None
        if (root / "unified" / "cgroup.procs").exists():
            unified = root / "unified" / own.get("", "/").lstrip("/") / group / session
        return kind, None, v1, unified
    raise CgroupError(errno.ENOTSUP, f"no usable cgroup hierarchy under {root} (need memory, cpu and pids)")


def create(
    session: str, root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None, group: str = GROUP
) -> Cgroup:
    """Create the session's cgroup below this process's own cgroup, in directory `group`."""
    kind, v2, v1, unified = _session_dirs(session, root, group, proc_cgroup)
    if kind == "v2" and v2 is not None:
        v2.parent.mkdir(parents=True, exist_ok=True)
        _enable_controllers(v2.parent.parent, v2.parent)
        v2.mkdir()
        return CgroupV2(v2)
    for d in v1:
        d.mkdir(parents=True)
    if unified is not None:
        unified.mkdir(parents=True)
    return CgroupV1(v1[0], v1[1], v1[2], unified)


def group_directories(
    root: Path = Path("/sys/fs/cgroup"), group: str = GROUP, proc_cgroup: str | None = None
) -> list[Path]:
    """The directories that hold sessions of `group`, one per hierarchy (they may not exist yet)."""
    _, v2, v1, unified = _session_dirs("_", root, group, proc_cgroup)
    return [d.parent for d in (v2, *v1, unified) if d is not None]


def existing(
    root: Path = Path("/sys/fs/cgroup"), group: str = GROUP, proc_cgroup: str | None = None
) -> dict[str, Cgroup]:
    """Session cgroups left in `group` (by session id): what a restarted daemon must deal with."""
    parents = group_directories(root, group, proc_cgroup)
    names = sorted({d.name for p in parents if p.is_dir() for d in p.iterdir() if d.is_dir()})
    found: dict[str, Cgroup] = {}
    for name in names:
        _, v2, v1, unified = _session_dirs(name, root, group, proc_cgroup)
        if v2 is not None:
            found[name] = CgroupV2(v2)
        else:
            memory, cpu, pids = v1
            found[name] = CgroupV1(memory, cpu, pids, unified if unified is not None and unified.is_dir() else None)
    return found


def _enable_controllers(parent: Path, base: Path) -> None:
    """Delegate memory, cpu and pids to the enforcer's group (v2 needs this at each level)."""
    for level in (parent, base):
        control = level / "cgroup.subtree_control"
        if control.exists():
            for c in CONTROLLERS:
                with contextlib.suppress(OSError):  # apply() reports a limit file that is missing
                    _write(control, f"+{c}")


def _controllers(directory: Path) -> set[str]:
    try:
        return set((directory / "cgroup.controllers").read_text().split())
    except FileNotFoundError:
        return set()


def delegated(directory: Path) -> bool:
    """Whether the cgroup is marked as delegated, as systemd marks a Delegate=yes unit's (its own test:
    trusted.delegate, else user.delegate). Only root can set the trusted one."""
    for name in ("trusted.delegate", "user.delegate"):
        try:
            return os.getxattr(directory, name) == b"1"
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOENT):
                raise
    return False


def _v2_base(root: Path, own: str) -> Path:
    """The v2 directory the session groups go below: this process's own cgroup, or the delegated
    cgroup whose leaf it is (the daemon and every process it forks live in that leaf)."""
    directory = root / own.lstrip("/")
    if directory.name == LEAF and directory.parent != root and delegated(directory.parent):
        return directory.parent
    return directory


@dataclass(frozen=True)
class Placement:
    leaf: Path  # holds the daemon's processes
    base: Path  # the session groups are made here, beside the leaf
    controllers: tuple[str, ...]  # enabled for them in base's cgroup.subtree_control


def place_in_leaf(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None, group: str = GROUP
) -> Placement | None:
    """On a pure cgroup v2 host whose cgroup for this process is delegated, move every process of
    that cgroup into its leaf LEAF and enable the controllers for the session groups beside it.
    None where there is nothing to do: v1 or hybrid hierarchies, or a cgroup not delegated (whose
    sessions then get no controllers: launches needing limits are refused)."""
    own = _own_paths(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    if detect(root) != "v2" or set(own) != {""}:
        return None
    directory = root / own[""].lstrip("/")
    if directory == root:
        return None  # the root cgroup may hold processes and is the host's, not ours
    if directory.name == LEAF and directory.parent != root and delegated(directory.parent):
        base = directory.parent  # started in the leaf already (systemd's DelegateSubgroup=daemon)
    elif delegated(directory):
        base = directory
    else:
        return None
    if group == LEAF:
        raise CgroupError(errno.EINVAL, f"the session cgroup group may not be named {LEAF!r}: that is the daemon's")
    return Placement(base / LEAF, base, move_into_leaf(base))


def move_into_leaf(base: Path, leaf: str = LEAF, rounds: int = 100) -> tuple[str, ...]:
    """Move every process of cgroup `base` into `base/leaf`, then enable in `base` the controllers it
    has of memory, cpu and pids. Returns those enabled. A process forked meanwhile is moved in a
    later round; one still there after `rounds` is an error, as is a controller that cannot be enabled."""
    target = base / leaf
    target.mkdir(exist_ok=True)
    for _ in range(rounds):
        pids = (base / "cgroup.procs").read_text().split()
        if not pids:
            break
        for pid in pids:
            try:
                _write(target / "cgroup.procs", pid)
            except ProcessLookupError:
                continue  # gone meanwhile
    else:
        if (base / "cgroup.procs").read_text().split():
            raise CgroupError(errno.EBUSY, f"processes still in {base} after moving them into {target}")
    enabled = []
    for controller in CONTROLLERS:
        if controller in _controllers(base):
            try:
                _write(base / "cgroup.subtree_control", f"+{controller}")
            except OSError as exc:
                raise CgroupError(exc.errno, f"cannot enable {controller} for the sessions in {base}: {exc}") from exc
            enabled.append(controller)
    return tuple(enabled)
