"""Learn mode's observer runs as root for the whole run and keeps the names the agent touches: an
agent creating names by the million grew its memory without a bound. It keeps a bounded number per
directory and in all, and says what it left out, to the user and in the learn.result record."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.cli.exec_learn import CROWDED_NOTES, bounded_notes, crowded_directories
from enforcer.sandbox import cgroups, fanotify

from ..helpers.session_cgroup import session_cgroup

GROUP = "adl-test-learn-flood"


def test_one_directory_keeps_its_first_names_and_is_named_crowded() -> None:
    seen = fanotify.Observed()
    for i in range(300_000):
        seen.add("written", f"/srv/work/out/f{i}")
    seen.add("read", "/srv/work/out/f0")  # another kind has its own count
    seen.add("written", "/srv/work/other")
    assert len(seen.written) == fanotify.MAX_NAMES_PER_DIRECTORY + 1
    assert seen.read == {"/srv/work/out/f0"}
    assert seen.crowded == {"/srv/work/out": {"written"}} and not seen.truncated
    (note,) = bounded_notes(seen)
    assert note.startswith(f"/srv/work/out: more than {fanotify.MAX_NAMES_PER_DIRECTORY} names written")


def test_names_in_all_are_bounded_and_the_observation_says_truncated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = fanotify.Observed()
    for d in range(2_000):  # a name in each of many directories: no directory is crowded
        for kind in ("read", "written", "executed", "directories"):
            seen.add(kind, f"/srv/d{d}/{kind}")
    kept = len(seen.read) + len(seen.written) + len(seen.executed) + len(seen.directories)
    assert kept == 8_000 and not seen.truncated
    monkeypatch.setattr(fanotify, "MAX_PATHS", kept + 10)
    for d in range(2_000, 4_000):
        seen.add("read", f"/srv/d{d}/read")
    assert len(seen.read) == 2_000 + 10 and seen.truncated
    notes = bounded_notes(seen)
    assert notes[-1].startswith(f"TRUNCATED: the run touched more than {kept + 10} distinct paths")


def test_many_crowded_directories_are_named_up_to_a_bound() -> None:
    seen = fanotify.Observed()
    for d in range(30):
        for i in range(fanotify.MAX_NAMES_PER_DIRECTORY + 1):
            seen.add("executed", f"/opt/d{d:02}/bin{i}")
    notes = bounded_notes(seen)
    assert len(notes) == 21 and notes[-1] == (
        "10 more crowded directories are not named here (of 30: all are in the learn.result record's "
        "crowded_directories)"
    )
    assert notes[0].startswith("/opt/d00: ") and "executed" in notes[0]


@pytest.fixture
def session() -> Iterator[tuple[str, cgroups.Cgroup]]:
    with session_cgroup(GROUP) as made:
        yield made


@pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root")
def test_an_agent_creating_thousands_of_names_is_observed_within_the_bounds(
    session: tuple[str, cgroups.Cgroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker, group = session
    monkeypatch.setattr(fanotify, "MAX_PATHS", 1_000)
    work = Path(tempfile.mkdtemp(prefix=f"adl-learn-flood-{os.getpid()}-", dir="/var/tmp"))
    observer = fanotify.Observer(marker)
    try:
        # 3,000 files in one directory, then one file in each of 1,500 directories.
        script = (
            "mkdir flat && i=0; while [ $i -lt 3000 ]; do : > flat/f$i; i=$((i+1)); done; "
            "i=0; while [ $i -lt 1500 ]; do mkdir d$i && : > d$i/f; i=$((i+1)); done"
        )

        def join() -> None:  # before the exec: the observer places a pid by its first event
            for path in group.join_files():
                Path(path).write_text(str(os.getpid()))

        subprocess.run(["sh", "-c", script], check=True, timeout=120, cwd=work, preexec_fn=join)
    finally:
        seen = observer.stop()
        shutil.rmtree(work, ignore_errors=True)
    flat = str(work / "flat")
    assert len([p for p in seen.written if p.startswith(flat + "/")]) == fanotify.MAX_NAMES_PER_DIRECTORY
    assert "written" in seen.crowded[flat]
    kept = len(seen.read) + len(seen.written) + len(seen.executed) + len(seen.directories)
    assert kept <= 1_000 and seen.truncated, (kept, seen.truncated, seen.overflowed)


def test_long_names_are_bounded_in_characters_not_only_in_count() -> None:
    """Names up to PATH_MAX long, a few per directory in many deep directories: within the bounds on
    names, the observer would keep MAX_PATHS names of 4,000 characters (and as many directory names),
    hundreds of megabytes in a process that runs as root. The observation is truncated first."""
    seen = fanotify.Observed()
    deep = "/srv/" + "/".join(["d" * 250] * 15)  # 3,769 characters of directories
    added = 0
    for d in range(fanotify.MAX_PATHS):
        for kind in ("read", "written"):
            seen.add(kind, f"{deep}/{d:06}/{'n' * 200}")
            added += 1
        if seen.truncated or added * len(deep) > 64 << 20:
            break
    kept = [*seen.read, *seen.written]
    assert seen.truncated, f"{len(kept)} names of {len(kept[0])} characters kept and counting"
    assert sum(len(p) for p in kept) <= fanotify.MAX_PATH_CHARACTERS
    assert bounded_notes(seen)[-1].startswith("TRUNCATED: ")


def test_crowded_directories_past_the_named_ones_are_all_in_the_record() -> None:
    """An agent crowding twenty directories that sort first pushes the one it cares about out of
    the named notes: the notes say how many were not named, and the record lists every one."""
    seen = fanotify.Observed()
    for d in range(CROWDED_NOTES):
        for i in range(fanotify.MAX_NAMES_PER_DIRECTORY + 1):
            seen.add("written", f"/srv/a{d:02}/f{i}")
    for i in range(fanotify.MAX_NAMES_PER_DIRECTORY + 1):
        seen.add("executed", f"/srv/zz-hidden/bin{i}")
    notes = bounded_notes(seen)
    assert not any("/srv/zz-hidden" in note for note in notes[:CROWDED_NOTES])
    assert notes[CROWDED_NOTES].startswith("1 more crowded directories are not named here (of 21")
    assert crowded_directories(seen)[-1] == "/srv/zz-hidden"


@pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and the process events connector need root")
def test_fork_links_forgotten_at_the_bound_are_counted_and_reported(
    session: tuple[str, cgroups.Cgroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The observer keeps the forks it saw to place a process gone before its events are read; at
    MAX_FORK_LINKS it forgets them all. The agent forks as often as it likes, so the forgetting is
    counted, and learn mode's output says so."""
    marker, group = session
    monkeypatch.setattr(fanotify, "MAX_FORK_LINKS", 50)
    observer = fanotify.Observer(marker)
    try:
        if observer.observed.forks_untracked:
            pytest.skip("no fork events here (not the host's first network namespace)")

        def join() -> None:
            for path in group.join_files():
                Path(path).write_text(str(os.getpid()))

        # 120 short-lived processes in the session: more forks than the links kept
        subprocess.run(
            ["sh", "-c", "i=0; while [ $i -lt 120 ]; do /bin/true; i=$((i+1)); done"],
            check=True,
            timeout=60,
            preexec_fn=join,
        )
        deadline = time.monotonic() + 10
        while observer.observed.forks_forgotten == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        seen = observer.stop()
    assert seen.forks_forgotten > 50
    assert bounded_notes(seen)[-1].startswith(f"FORKS FORGOTTEN: {seen.forks_forgotten} fork links were dropped")
