"""What a kernel denial means in policy terms: the rule that denied it and the grant that would allow it.

Pure: a denial is described by its mechanism, the Landlock rights that blocked it (`fs.read_file`,
`net.connect_tcp`, ...) or the seccomp system call, and its object. The answer names the policy's
own reason (the decider's rule id and JSON Pointer), and a fragment an author could add, or says
why no grant exists (an explicit deny, or a call no sandbox may make).
"""

from __future__ import annotations

import posixpath
from typing import Any

from ..quick_dataclass import dataclass
from .decider import decide
from .model import FileAccess, NetworkConnect, Policy, ProcessExec

READ_RIGHTS = frozenset({"fs.read_file", "fs.read_dir"})
WRITE_RIGHTS = frozenset(
    {
        "fs.write_file",
        "fs.truncate",
        "fs.remove_dir",
        "fs.remove_file",
        "fs.make_char",
        "fs.make_dir",
        "fs.make_reg",
        "fs.make_sock",
        "fs.make_fifo",
        "fs.make_block",
        "fs.make_sym",
        "fs.refer",
    }
)


@dataclass(frozen=True)
class Grant:
    access: str  # read | write | read_write | execute | ioctl | connect | bind | scope | syscall
    rules: tuple[dict[str, str], ...]  # the policy's reasons for the denial
    grant: dict[str, Any] | None  # {"pointer": ".../-", "value": ...}: what to add to the ADL document
    text: str  # one line for humans


def access_of(blockers: tuple[str, ...]) -> str:
    rights = set(blockers)
    if "fs.execute" in rights:
        return "execute"
    if rights == {"fs.ioctl_dev"}:
        return "ioctl"
    reads, writes = bool(rights & READ_RIGHTS), bool(rights & WRITE_RIGHTS)
    if reads and writes:
        return "read_write"
    if writes:
        return "write"
    if reads:
        return "read"
    if "net.connect_tcp" in rights:
        return "connect"
    if "net.bind_tcp" in rights:
        return "bind"
    return "scope"


def explain_landlock(policy: Policy, blockers: tuple[str, ...], path: str | None, port: int | None) -> Grant:
    access = access_of(blockers)
    reasons: tuple[dict[str, str], ...] = ()
    if access == "execute" and path:
        decision = decide(policy, ProcessExec((path,), resolved_path=path))
        reasons = tuple(r.to_json() for r in decision.reasons)
        if decision.allowed:
            return Grant(access, reasons, None, f"the policy allows executing {path}; the kernel did not")
        if reasons and reasons[0]["rule"] in ("exec.denied", "exec.shell"):
            return Grant(access, reasons, None, reasons[0]["text"])
        value = {"pointer": "/permissions/execution/allowed_commands/-", "value": path}
        return Grant(access, reasons, value, f"add {path!r} to permissions.execution.allowed_commands")
    if access in ("read", "write", "read_write") and path:
        decision = decide(policy, FileAccess(path, access))  # type: ignore[arg-type]
        reasons = tuple(r.to_json() for r in decision.reasons)
        if decision.allowed:
            return Grant(access, reasons, None, f"the policy allows {access} of {path}; the kernel layer did not")
        if reasons and reasons[0]["rule"] == "fs.denied":
            return Grant(access, reasons, None, reasons[0]["text"])
        entry = {"path": path, "access": access}
        return Grant(
            access,
            reasons,
            {"pointer": "/permissions/filesystem/allowed_paths/-", "value": entry},
            f"add {{'path': {path!r}, 'access': {access!r}}} to permissions.filesystem.allowed_paths",
        )
    if access == "ioctl":
        text = (
            f"ioctl on the device {path}: no policy grants device ioctls (programs asking whether it is a"
            " terminal get an error and carry on)"
        )
        return Grant(access, (), None, text)
    if access == "connect":
        if port is not None:
            decision = decide(policy, NetworkConnect("0.0.0.0", port))
            reasons = tuple(r.to_json() for r in decision.reasons)
        text = "TCP connections leave only through the egress filter: allow the host in permissions.network"
        return Grant(access, reasons, None, text)
    if access == "bind":
        return Grant(access, (), None, "an agent never listens on TCP: no policy grants binding a port")
    return Grant(access, (), None, f"{','.join(blockers)}: the sandbox's scope isolation, not grantable by policy")


# Denials every program meets, said plainly so nobody chases them.
_SECCOMP_HINTS = {
    "socket": "unix, netlink, raw and packet sockets are denied to every agent (glibc's user lookups try"
    " a unix socket first and carry on without it)",
}


def explain_seccomp(syscall_name: str | None) -> Grant:
    name = syscall_name or "?"
    text = _SECCOMP_HINTS.get(name, f"the seccomp baseline denies {name} to every agent; no policy grants it")
    return Grant(
        "syscall",
        ({"rule": "sandbox.seccomp", "pointer": "", "document": "enforcer", "text": f"{name} is always denied"},),
        None,
        text,
    )


def collapse(path: str) -> str:
    """The pattern a learned path is widened to: a file's directory with `/**` below it."""
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    return parent.rstrip("/") + "/**"
