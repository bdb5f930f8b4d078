"""Learn mode's policy writer: what it adds, what it leaves out, how paths collapse."""

from __future__ import annotations

from enforcer.policy import learn as lm

START = {"adl_spec": "0.3.0", "name": "L", "permissions": {"execution": {"allowed_commands": ["python3"]}}}


def test_collapse_rules() -> None:
    assert lm.collapse({"/w/a", "/w/b/c"}, "/home/me/w") == ["/w/a", "/w/b/c"]
    assert lm.collapse({"/home/me/w/a", "/home/me/w/b/c"}, "/home/me/w") == ["/home/me/w/**"]
    assert lm.collapse({"/a/b/d/1", "/a/b/d/2", "/a/b/d/3", "/e/1"}, "/x/y") == ["/a/b/d/**", "/e/1"]
    assert lm.collapse({"/etc/a", "/etc/b", "/etc/c"}, "/x/y") == ["/etc/a", "/etc/b", "/etc/c"]  # never /etc/**
    # the shallowest directory with enough entries below it, nested caches included
    site = "/v/lib/py/site"
    found = {f"{site}/a/x", f"{site}/b/y", f"{site}/c/z", f"{site}/c/w/__pycache__/q"}
    assert lm.collapse(found, "/x/y") == [f"{site}/**"]
    assert lm.collapse({"/etc/a"}, "/") == ["/etc/a"]  # a run started in / never grants /**


def test_learn_adds_only_what_is_missing_and_says_why_for_shells() -> None:
    seen = lm.Observations(
        read={"/usr/lib/x.so", "/etc/gitconfig", "/home/me/w/a.txt", "/proc/self/status"},
        written={"/home/me/w/out.txt"},
        executed={"/usr/bin/git", "/bin/sh"},
        hosts={("api.example.com", 443)},
    )
    result = lm.learn(START, seen, cwd="/home/me/w", already_granted=["/usr/lib"])
    paths = result.document["permissions"]["filesystem"]["allowed_paths"]
    assert {"path": "/home/me/w/**", "access": "read_write"} in paths
    assert {"path": "/etc/gitconfig", "access": "read"} in paths
    assert not any(p["path"].startswith(("/usr/lib", "/proc")) for p in paths)
    execution = result.document["permissions"]["execution"]
    assert execution["allowed_commands"] == ["python3", "/usr/bin/git"] and execution["allow_shell"] is True
    assert result.notes and "shell" in result.notes[0]
    assert result.document["permissions"]["network"]["allowed_hosts"] == ["api.example.com"]
    assert START["permissions"] == {"execution": {"allowed_commands": ["python3"]}}  # the start is untouched
    diff = lm.diff(START, result.document, "start", "out")
    assert diff.startswith("--- start") and '"path": "/etc/gitconfig"' in diff


def test_learn_mode_is_refused_with_the_daemon(capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from enforcer.cli import exec as exec_cli

    with pytest.raises(SystemExit) as refused:
        exec_cli.main(["--daemon", "unix:/nonexistent", "--learn", "out.json", "--agent", "a", "--", "true"])
    assert refused.value.code == 2 and "--learn runs embedded only" in capsys.readouterr().err


def test_a_name_that_is_not_utf8_is_left_out_and_named_escaped() -> None:
    """fsdecode keeps bytes that are not UTF-8 as surrogates: neither a document nor the audit log
    can hold them. The name is left out (never widened to its directory) and a note names it."""
    odd = "/srv/data/odd-\udcff.txt"
    seen = lm.Observations(read={odd, "/srv/data/fine.txt"}, executed={"/opt/bin/tool-\udcfe"})
    result = lm.learn(START, seen, cwd="/home/me/w", already_granted=[])
    assert [e["path"] for e in result.added_paths] == ["/srv/data/fine.txt"]
    assert result.added_commands == ()
    assert result.notes == (
        "/srv/data/odd-\\xff.txt not granted: its name is not UTF-8, which a policy document cannot hold "
        "(grant a directory above it by hand if the agent needs it)",
        "/opt/bin/tool-\\xfe not granted: its name is not UTF-8, which a policy document cannot hold "
        "(grant a directory above it by hand if the agent needs it)",
    )
    lm.diff(START, result.document, "a", "b").encode("utf-8")  # nothing left that cannot be written


def test_a_note_quoting_a_name_that_is_not_utf8_is_escaped() -> None:
    seen = lm.Observations(written={"/\udcff/f"})
    result = lm.learn(START, seen, cwd="/home/me/w", already_granted=[])
    assert "filesystem" not in result.document["permissions"]
    assert result.notes == (
        "/\\xff/** read_write: the run wrote directly in a top-level directory (review: it grants all of it)",
        "/\\xff/** not granted: its name is not UTF-8, which a policy document cannot hold "
        "(grant a directory above it by hand if the agent needs it)",
    )
