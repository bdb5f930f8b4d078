"""One launch, embedded adl-exec's and the daemon's alike: policy, plan, audit log, session.

Every step that fails ends in a refusal, recorded in the audit log with its reason before the
caller hears of it. The two callers differ only in the LaunchRequest they build and in how they
present the result: embedded adl-exec prints it and exits with its code, the daemon's session
supervisor reports SessionEnded to the caller that asked for the session.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import data, policy_cache
from .audit import AuditUnavailable, AuditWriter, records
from .audit.events import agent_of, caller_fields
from .documents import PolicyFileError
from .policy import Policy
from .policy.errors import Refusal
from .quick_dataclass import dataclass
from .sandbox import cgroups, identity, runtime_presets
from .sandbox.launcher import LaunchError, Outcome
from .sandbox.plan import DEFAULT_PIDS_MAX, Baseline, HostFeatures, LaunchPlan, Layer, PlanError, build_plan
from .sandbox.stage import Prepared
from .session import host_features, record_refusal, run_session

if TYPE_CHECKING:  # pydantic is slow to import: only plans with a network layer load it
    from .egress_values import EgressValues


@dataclass(frozen=True)
class CompiledPolicy:
    policy: Policy
    baseline: Baseline
    adl_document: dict[str, Any]  # the document the policy was compiled from: its presets, learn mode
    warning: str | None = None  # for the operator, about how it was loaded (the compiled-policy cache)


class PolicySource(Protocol):
    def load(self, features: HostFeatures) -> CompiledPolicy:
        """Raises Refusal or OSError when there is no policy to launch with."""
        ...


@dataclass(frozen=True)
class PolicyFiles:
    """Documents on disk (embedded adl-exec), compiled through the compiled-policy cache."""

    adl: Path
    aaif: Path | None
    regions: Path | None
    baseline: Path
    production: bool
    home_region: str | None
    cache_dir: Path | None  # the compiled-policy cache (None: off)
    spec_dir: Path | None = None  # the schemas to validate with (None: the package's own)

    def load(self, features: HostFeatures) -> CompiledPolicy:
        loaded = policy_cache.load(
            self.adl,
            self.aaif,
            self.regions,
            self.baseline,
            production=self.production,
            home_region=self.home_region,
            features=features,
            directory=self.cache_dir,
            spec_dir=self.spec_dir,
        )
        # The presets a document asks for and learn mode read the document itself: the very bytes
        # the policy was compiled from, parsed without the validation code a warm launch skips.
        return CompiledPolicy(loaded.policy, loaded.baseline, parsed_adl(loaded.adl_bytes, self.adl), loaded.warning)


@dataclass(frozen=True)
class PolicyDocuments:
    """Documents the daemon has checked, compiled again here (LaunchRequest.policy_digest holds
    what they compiled to when the daemon decided). Compiled policies are remembered in this
    process (see _COMPILED): the daemon's spawner compiles an order's documents before it forks the
    session's supervisor, which finds them compiled."""

    adl: dict[str, Any]
    aaif: dict[str, Any] | None
    regions: Path
    baseline: Path
    production: bool
    home_region: str | None
    spec_dir: Path | None = None  # the schemas to validate with (None: the package's own)

    def load(self, features: HostFeatures | None = None) -> CompiledPolicy:
        # Compiling does not read the host's features: they are not in the key.
        from .documents import read_bytes

        regions, baseline = read_bytes(self.regions), self.baseline.read_bytes()
        key = self._key(regions, baseline)
        now = datetime.now(UTC)
        remembered = _COMPILED.get(key)
        if remembered is not None and remembered.valid_from <= now.timestamp() < remembered.valid_until:
            return remembered.compiled
        entry = self._compile(regions, baseline, now)
        _COMPILED.pop(key, None)
        while len(_COMPILED) >= COMPILED_ENTRIES:
            del _COMPILED[next(iter(_COMPILED))]  # the oldest
        _COMPILED[key] = entry
        return entry.compiled

    def _key(self, regions: bytes, baseline: bytes) -> str:
        """Every input of the compilation: the documents, the region map's and the baseline's paths
        and bytes, the compile settings and the schemas' directory (this process's own code)."""
        inputs = [
            json.dumps([self.adl, self.aaif], sort_keys=True, separators=(",", ":"), ensure_ascii=False),
            str(self.regions),
            hashlib.sha256(regions).hexdigest(),
            str(self.baseline),
            hashlib.sha256(baseline).hexdigest(),
            self.production,
            self.home_region,
            None if self.spec_dir is None else str(self.spec_dir),
        ]
        return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()

    def _compile(self, regions: bytes, baseline: bytes, now: datetime) -> _Remembered:
        from .documents import regions_from_bytes, schema_set
        from .policy import CompileOptions, compile_policy
        from .policy.compiler import time_boundaries
        from .sandbox.plan import load_baseline

        # Compiled from the very bytes the key digests: a file changed meanwhile cannot be filed
        # under the old content's key.
        options = CompileOptions(
            production=self.production,
            regions=regions_from_bytes(regions, str(self.regions)),
            home_region=self.home_region,
        )
        policy = compile_policy(self.adl, self.aaif, schema_set(self.spec_dir), now, options)
        loaded = load_baseline(self.baseline)
        if loaded.digest != "sha256:" + hashlib.sha256(baseline).hexdigest():
            raise PlanError(f"{self.baseline} changed while it was read")
        # The time decides only at these boundaries: the policy is exact until the next one.
        moment, boundaries = now.timestamp(), [b.timestamp() for b in time_boundaries(self.adl)]
        return _Remembered(
            CompiledPolicy(policy, loaded, self.adl),
            max((b for b in boundaries if b <= moment), default=float("-inf")),
            min((b for b in boundaries if b > moment), default=float("inf")),
        )


@dataclass(frozen=True)
class _Remembered:
    compiled: CompiledPolicy
    valid_from: float  # the POSIX times between which compiling again gives the same policy
    valid_until: float


# The policies PolicyDocuments compiled in this process, by _key(). Only this process and its
# forks read it; each supervisor is a fork of the spawner and checks the policy's digest as before.
COMPILED_ENTRIES = 32
_COMPILED: dict[str, _Remembered] = {}


def parsed_adl(data: bytes, path: Path) -> dict[str, Any]:
    """The ADL document as a mapping: JSON directly, YAML through the loader."""
    try:
        document = json.loads(data)
    except ValueError:
        from .documents import document_from_bytes

        return document_from_bytes(data, str(path), "adl")
    if not isinstance(document, dict):
        raise PolicyFileError(str(path), "not an ADL document")
    return document


@dataclass(frozen=True)
class Masks:
    """Paths hidden from the session whatever its grants say, and the layer that says so."""

    directories: tuple[Path, ...]
    files: tuple[Path, ...]
    layer: str
    detail: str


@dataclass(frozen=True)
class LaunchRequest:
    session: str
    argv: tuple[str, ...]
    environ: Mapping[str, str]
    policy: PolicySource
    # What the policy must compile to (the digest the daemon decided on: it may have been reloaded
    # since); None takes what it compiles to.
    policy_digest: str | None = None
    # The agent's account: given (the daemon's caller), or resolved here from a --user spec (None:
    # this process's unprivileged account, or sudo's caller).
    user: identity.Identity | str | None = None
    # Entered with the agent's credentials before planning (the daemon's caller asks for one);
    # None keeps this process's working directory.
    cwd: str | None = None
    # The daemon's caller: its uid and working directory go into the launch and refusal records.
    caller_uid: int | None = None
    accept_unenforced: frozenset[str] = frozenset()
    pids_max: int = DEFAULT_PIDS_MAX
    # The egress filter's settings, or what loads them when the plan has a network (None: defaults).
    egress: EgressValues | Callable[[], EgressValues] | None = None
    masks: Masks | None = None
    cgroup_group: str = cgroups.GROUP
    presets: Path = data.PRESETS  # the runtime presets catalog
    kernel_audit: bool = True  # record the kernel's denials (the kernel_audit setting)
    explain_only: bool = False  # plan, report the layers that cannot be enforced, run nothing


class Observer(Protocol):
    """What a caller adds to the common steps (embedded adl-exec: its warnings, learn mode)."""

    def warn(self, message: str) -> None: ...

    def planned(self, compiled: CompiledPolicy, plan: LaunchPlan) -> None:
        """May change the plan before the launch record is written, or raise Refusal."""
        ...

    def ended(self, audit_dir: Path) -> dict[str, Any] | None:
        """The payload of one more decision record about the session, or None."""
        ...


@dataclass(frozen=True)
class Refused:
    reason: str
    unaudited: str | None = None  # why the refusal is not in the audit log


@dataclass(frozen=True)
class Terminated:
    step: str  # when TerminateSession ended it: "before the agent started", ...


@dataclass(frozen=True)
class Explained:
    policy: Policy
    plan: LaunchPlan


@dataclass(frozen=True)
class Ended:
    outcome: Outcome
    kernel_denials: dict[str, Any]
    audit_dir: Path


Result = Refused | Terminated | Explained | Ended


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


def launch(
    request: LaunchRequest,
    open_audit: Callable[[], AuditWriter],
    *,
    prepared: Prepared | None = None,
    terminated: Callable[[], bool] = _never,
    before_fork: Callable[[], None] = _nothing,
    observer: Observer | None = None,
    report: Callable[[Result], None] | None = None,
) -> Result:
    """Load the policy, plan, audit the launch, run the session, audit its end. `open_audit` is
    not called with explain_only (nothing is recorded then). `prepared`: the stage forked ahead.
    `terminated`: whether TerminateSession ended the session meanwhile (the caller kills the
    stage). `before_fork`: called once the launch is planned, before this process forks again or
    starts the agent (after the launch record), or before it reports that TerminateSession ended
    the launch; what it raises refuses the launch. `report`: given the result once every record of
    it is durable, before the audit writer is closed (its checkpoint and HEAD need not delay the
    caller)."""
    if request.explain_only:
        return _Launch(request, None, observer).run(prepared, terminated, before_fork)
    try:
        writer = open_audit()
    except AuditUnavailable as exc:
        return Refused(f"audit log unavailable, nothing runs unrecorded: {exc}")
    try:
        result = _Launch(request, writer, observer).run(prepared, terminated, before_fork)
        if report is not None:
            report(result)
        return result
    finally:
        writer.close()


@dataclass(frozen=True)
class _Planned:
    policy: Policy
    plan: LaunchPlan
    switch_to: tuple[int | None, int | None]  # the uid/gid the launcher switches to; None: this process's
    cwd: str | None  # the directory entered as the agent, when the request named one


class _Launch:
    """One launch's steps; the policy, once loaded, is named in every refusal record after it."""

    def __init__(self, request: LaunchRequest, writer: AuditWriter | None, observer: Observer | None) -> None:
        self.request, self.writer, self.observer = request, writer, observer
        self.policy: Policy | None = None
        self.remove_session_tmp: Callable[[], None] = _nothing

    def run(self, prepared: Prepared | None, terminated: Callable[[], bool], before_fork: Callable[[], None]) -> Result:
        try:
            try:
                planned = self._plan()
            except (Refusal, OSError) as exc:
                return self._refuse(str(exc))
            if self.request.explain_only:
                return Explained(planned.policy, planned.plan)
            if terminated():
                try:
                    before_fork()
                except OSError as exc:
                    return self._refuse(str(exc))
                return self._terminated("before the agent started")
            return self._session(planned, prepared, terminated, before_fork)
        finally:
            self.remove_session_tmp()

    def _plan(self) -> _Planned:
        request = self.request
        features = host_features()
        compiled = request.policy.load(features)
        self.policy = compiled.policy
        if request.policy_digest is not None and compiled.policy.digest != request.policy_digest:
            raise PlanError("the agent's policy changed while it was being launched; try again")
        if compiled.warning:
            self._warn(compiled.warning)
        uid, gid = (None, None) if request.explain_only else self._identity()
        cwd = None
        if request.cwd is not None:
            cwd = enter_as_caller(request.cwd, *_account(uid, gid))
        baseline, presets_applied = runtime_presets.extend(
            compiled.baseline, compiled.adl_document, catalog_path=request.presets
        )
        plan = build_plan(
            compiled.policy,
            list(request.argv),
            baseline=baseline,
            environ=dict(request.environ),
            features=features,
            accept_unenforced=request.accept_unenforced,
            cwd=cwd,
            pids_max=request.pids_max,
            explain_only=request.explain_only,
            egress=request.egress,
        )
        if request.masks is not None:
            apply_masks(plan, request.masks)
        self.remove_session_tmp = runtime_presets.finish_plan(
            plan, presets_applied, uid=uid, gid=gid, explain_only=request.explain_only
        )
        if self.observer is not None:
            self.observer.planned(compiled, plan)
        if not request.explain_only:
            for domain in plan.accepted_unenforced:
                self._warn(f"'{domain}' is NOT enforced (accepted with --accept-unenforced)")
        return _Planned(compiled.policy, plan, (uid, gid), cwd)

    def _identity(self) -> tuple[int | None, int | None]:
        """The uid/gid the stage switches to; None, None when the agent runs as this process."""
        user = self.request.user
        if isinstance(user, identity.Identity):
            chosen = user
        else:
            try:
                chosen = identity.resolve(user, os.geteuid(), os.getegid(), self.request.environ)
            except identity.IdentityError as exc:
                raise PlanError(str(exc)) from None
        if chosen.uid == os.geteuid() and chosen.gid == os.getegid():
            return None, None
        return chosen.uid, chosen.gid

    def _session(
        self,
        planned: _Planned,
        prepared: Prepared | None,
        terminated: Callable[[], bool],
        before_fork: Callable[[], None],
    ) -> Result:
        assert self.writer is not None
        policy = planned.policy
        denials: dict[str, Any] = {}
        try:
            outcome = run_session(
                policy,
                planned.plan,
                self.writer,
                self.request.session,
                uid=planned.switch_to[0],
                gid=planned.switch_to[1],
                cgroup_group=self.request.cgroup_group,
                kernel_audit=self.request.kernel_audit,
                prepared=prepared,
                on_denials=denials.update,
                caller=self._caller(planned.cwd),
                before_start=before_fork,
            )
            extra = self.observer.ended(self.writer.directory) if self.observer is not None else None
            if extra is not None:
                self.writer.append(
                    records.DECISION,
                    {"agent": agent_of(policy), **extra},
                    corr=self.request.session,
                    priority="high",
                    sync=True,
                )
        except (LaunchError, AuditUnavailable) as exc:
            if terminated():  # the stage was killed under the launcher: not a failure to report
                return self._terminated(f"while the sandbox was set up ({exc})")
            return self._refuse(str(exc) if isinstance(exc, LaunchError) else f"audit log failed: {exc}")
        return Ended(outcome, denials, self.writer.directory)

    def _caller(self, cwd: str | None) -> dict[str, Any] | None:
        if self.request.caller_uid is None:
            return None
        return caller_fields(self.request.caller_uid, cwd if cwd is not None else self.request.cwd)

    def _record_refusal(self, reason: str) -> str | None:
        """Why the refusal could not be recorded, or None."""
        if self.writer is None:
            return None
        try:
            record_refusal(
                self.writer, self.policy, self.request.session, reason, list(self.request.argv), self._caller(None)
            )
        except AuditUnavailable as exc:
            return f"refusal not audited: {exc}"
        return None

    def _refuse(self, reason: str) -> Refused:
        return Refused(reason, self._record_refusal(reason))

    def _terminated(self, step: str) -> Terminated:
        self._record_refusal(f"terminated by TerminateSession {step}")
        return Terminated(step)

    def _warn(self, message: str) -> None:
        if self.observer is not None:
            self.observer.warn(message)


def _account(uid: int | None, gid: int | None) -> tuple[int, int]:
    return (os.getuid() if uid is None else uid), (os.getgid() if gid is None else gid)


def apply_masks(plan: LaunchPlan, masks: Masks) -> None:
    for directory in masks.directories:
        if directory.is_dir() and str(directory) not in plan.dir_masks:
            plan.dir_masks.append(str(directory))
    for file in masks.files:
        if file.is_file() and str(file) not in plan.file_masks:
            plan.file_masks.append(str(file))
    plan.layers.append(Layer(masks.layer, "mount namespace masks", "active", [masks.detail]))


def enter_as_caller(path: str, uid: int, gid: int) -> str:
    """Change to the working directory the caller asked for, found with the credentials the agent
    will have (uid, gid, no supplementary groups), never root's: a directory the caller could not
    reach or enter itself (another user's 0700 home, or what is behind it) is refused. The lookup
    runs in a thread that takes those credentials (sandbox/as_caller.py), or where it cannot, in a
    child that drops to them; either hands the directory back as a descriptor, and this process
    then enters that very directory, so nothing can swap the path in between. Returns its path."""
    if uid == os.getuid():
        os.chdir(path)
        return _recordable(os.getcwd())
    from .sandbox import as_caller

    try:
        fd = as_caller.open_directory(path, uid, gid)
    except as_caller.Unsupported:
        fd = _open_in_child(path, uid, gid)
    except OSError as exc:
        raise PermissionError(
            f"working directory {path!r}: not reachable as uid {uid}: {exc.strerror or exc}"
        ) from None
    try:
        # The lookup thread may enter this process's own /proc entries (its descriptors among them)
        # as the caller never could; and a directory of the host's /proc would stay the agent's view
        # of the host's processes. None has a use as a session's working directory.
        if as_caller.on_proc(fd):
            raise PermissionError(f"working directory {path!r}: a directory of /proc is never a session's")
        os.fchdir(fd)
    finally:
        os.close(fd)
    return _recordable(os.getcwd())


def _end_lookup(pid: int) -> None:
    """Kill a lookup child that did not answer and collect it if it dies soon; one held in the
    kernel past SIGKILL (an uninterruptible wait) is left to end by itself, not waited for."""
    pidfd = os.pidfd_open(pid)  # not yet collected: the pid is still the child's
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if poller.poll(1000):
            os.waitpid(pid, 0)
    finally:
        os.close(pidfd)


def _recordable(path: str) -> str:
    """`path`, which the launch record holds as text: a name that is not UTF-8 is refused as such
    (rather than as a failure of the audit log when the record cannot be written)."""
    try:
        path.encode()
    except UnicodeEncodeError:
        shown = path.encode(errors="surrogateescape")
        raise PermissionError(f"working directory {shown!r}: not UTF-8 (the audit log records it as text)") from None
    return path


def _open_in_child(path: str, uid: int, gid: int) -> int:
    """The directory as uid/gid find it, looked up in a child process with those credentials. A
    lookup that has not answered within as_caller.LOOKUP_TIMEOUT_S (a filesystem that does not
    answer) is refused, as from the lookup thread, and its child killed."""
    from .sandbox.as_caller import LOOKUP_TIMEOUT_S

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            # Nothing of root's to reach through /proc/self/fd/N or /proc/self/cwd: those magic
            # links would open what they point at without the path's permission checks.
            os.chdir("/")
            os.closerange(0, theirs.fileno())
            os.closerange(theirs.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                named = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                # "." needs the search permission cd needs: O_PATH checks none on the last component.
                fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=named)
            except OSError as exc:
                theirs.sendall(f"{exc.strerror or exc}".encode()[:512])
            else:
                socket.send_fds(theirs, [b"ok"], [fd])
                code = 0
        finally:
            os._exit(code)
    theirs.close()
    ours.settimeout(LOOKUP_TIMEOUT_S)
    try:
        message, fds, _flags, _addr = socket.recv_fds(ours, 512, 1, socket.MSG_CMSG_CLOEXEC)
    except BaseException as exc:
        _end_lookup(pid)
        if isinstance(exc, TimeoutError):
            raise PermissionError(
                f"working directory {path!r}: not reachable as uid {uid}: its lookup did not return within "
                f"{LOOKUP_TIMEOUT_S:g} s (a filesystem that does not answer)"
            ) from None
        raise
    finally:
        ours.close()
    os.waitpid(pid, 0)  # it has answered: it exits at once
    if not fds:
        detail = message.decode(errors="replace") or "the lookup failed"
        raise PermissionError(f"working directory {path!r}: not reachable as uid {uid}: {detail}")
    return fds[0]
