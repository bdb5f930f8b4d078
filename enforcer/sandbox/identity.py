"""Who the agent runs as. Never host root: a root agent without capabilities still owns root's
files, and chmod, setuid bits, xattrs and ACLs are not Landlock rights.

Chosen as users expect: in embedded adl-exec, `--user NAME|UID[:GID]`, else the user who ran it
through sudo (SUDO_UID/SUDO_GID), else adl-exec's own uid when it is not root; root with none of
these is refused, and the refusal says what to pass. In daemon mode the agent runs as the caller's
peer uid (enforcer/daemon/launch.py), and session.run_session refuses uid or gid 0 for both modes.
The identity should own nothing outside the agent's grants: a dedicated user, or nobody; the
operator makes the workspace writable by it (chown).
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Mapping

from ..quick_dataclass import dataclass


class IdentityError(ValueError):
    """No acceptable identity for the agent (the message says what to pass)."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    source: str  # "--user", "sudo", "caller"


ROOT_REFUSAL = (
    "the agent never runs as host root: pass --user NAME|UID[:GID] (a user that owns nothing outside "
    "the agent's grants, e.g. --user nobody, with the workspace chowned to it), or run adl-exec with "
    "sudo from the account the agent should run as"
)


def parse_user(spec: str) -> Identity:
    """`NAME`, `UID`, `NAME:GROUP` or `UID:GID`. A numeric uid without a passwd entry needs its gid."""
    user, _, group = spec.partition(":")
    if not user:
        raise IdentityError(f"--user {spec}: expected NAME|UID[:GID]")
    entry: pwd.struct_passwd | None
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if not user.isdigit():
            raise IdentityError(f"--user {spec}: no such user") from None
        entry = None
    uid = int(user) if entry is None else entry.pw_uid
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise IdentityError(f"--user {spec}: no such group") from None
    elif entry is not None:
        gid = entry.pw_gid
    else:
        raise IdentityError(f"--user {spec}: uid {uid} has no passwd entry, give its group too (UID:GID)")
    return _unprivileged(Identity(uid, gid, "--user"))


def resolve(spec: str | None, euid: int, egid: int, environ: Mapping[str, str]) -> Identity:
    """The agent's identity for an embedded adl-exec running as euid/egid."""
    if spec is not None:
        return parse_user(spec)
    if euid != 0:
        return _unprivileged(Identity(euid, egid, "caller"))
    sudo_uid, sudo_gid = environ.get("SUDO_UID", ""), environ.get("SUDO_GID", "")
    if sudo_uid.isdigit() and sudo_gid.isdigit() and int(sudo_uid) != 0:
        return _unprivileged(Identity(int(sudo_uid), int(sudo_gid), "sudo"))
    raise IdentityError(ROOT_REFUSAL)


def _unprivileged(identity: Identity) -> Identity:
    if identity.uid == 0:
        raise IdentityError(ROOT_REFUSAL)
    if identity.gid == 0:
        raise IdentityError("the agent never runs in host group 0: give a group with --user NAME|UID:GID")
    return identity
