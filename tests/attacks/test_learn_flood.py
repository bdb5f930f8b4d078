"""Learn mode's observer runs as root for the whole run and keeps the names the agent touches: an
agent creating names by the million grew its memory without a bound. It keeps a bounded number per
directory and in all, and says what it left out, to the user and in the learn.result record."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.cli.exec_learn import bounded_notes
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
    assert len(notes) == 21 and notes[-1] == "10 more directories had more names than were kept"
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
