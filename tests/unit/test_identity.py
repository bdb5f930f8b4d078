"""Choosing the agent's identity: --user, the sudo caller, the caller; never uid or gid 0."""

from __future__ import annotations

import pwd

import pytest

from enforcer.sandbox.identity import ROOT_REFUSAL, Identity, IdentityError, parse_user, resolve

NOBODY = pwd.getpwnam("nobody")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nobody", (NOBODY.pw_uid, NOBODY.pw_gid)),
        (str(NOBODY.pw_uid), (NOBODY.pw_uid, NOBODY.pw_gid)),
        (f"nobody:{NOBODY.pw_gid}", (NOBODY.pw_uid, NOBODY.pw_gid)),
        ("nobody:12345", (NOBODY.pw_uid, 12345)),
        ("123456789:123456789", (123456789, 123456789)),  # no passwd entry: allowed with its gid
    ],
)
def test_user_specs(spec: str, expected: tuple[int, int]) -> None:
    assert parse_user(spec) == Identity(*expected, "--user")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("root", "never runs as host root"),
        ("0", "never runs as host root"),
        ("0:65534", "never runs as host root"),
        ("nobody:0", "group 0"),
        ("nobody:root", "group 0"),
        ("123456789", "needs its gid|give its group"),
        ("no-such-user-here", "no such user"),
        ("nobody:no-such-group-here", "no such group"),
        (":65534", "expected NAME"),
    ],
)
def test_refused_user_specs(spec: str, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        parse_user(spec)


def test_resolution_order() -> None:
    sudo = {"SUDO_UID": "1000", "SUDO_GID": "1001"}
    assert resolve("nobody", 0, 0, sudo).source == "--user"
    assert resolve(None, 0, 0, sudo) == Identity(1000, 1001, "sudo")
    assert resolve(None, 1000, 1000, {}) == Identity(1000, 1000, "caller")
    for environ in ({}, {"SUDO_UID": "0", "SUDO_GID": "0"}, {"SUDO_UID": "x", "SUDO_GID": "1"}, {"SUDO_UID": "5"}):
        with pytest.raises(IdentityError) as refused:
            resolve(None, 0, 0, environ)
        assert str(refused.value) == ROOT_REFUSAL and "--user" in ROOT_REFUSAL and "sudo" in ROOT_REFUSAL
