"""adl-exec --learn OUT: run once with files observed instead of restricted, then write the smallest
policy that would have allowed what the run did, and print its diff against the start policy.

What changes for a learning run, and only for it: Landlock grants reading, writing and executing
everything and no mount is made noexec (denied paths stay masked; seccomp, namespaces, cgroups and
the egress filter stay as they are), and fanotify records what the session's processes open,
execute and write. It says so on stderr before and after the run and in the launch record (the
filesystem layer's status is "learning"). Refused with --production and with --daemon.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..audit.query import iter_records
from ..paths import replace_file
from ..policy import learn as learning
from ..sandbox import fanotify, landlock
from ..sandbox.plan import LaunchPlan, PlanError
from ..text import escape_non_utf8

BANNER = (
    "adl-exec: LEARN MODE: files are observed, NOT restricted, for this run (Landlock grants everything,"
    " no mount is noexec;"
    " denied paths stay masked, seccomp, namespaces, cgroups and the egress filter stay enforced)."
    " Run only code you would run without a sandbox."
)


class Learner:
    def __init__(self, out: Path, start_path: Path, start: dict[str, Any], plan: LaunchPlan, session: str) -> None:
        self.out, self.start_path, self.start, self.plan, self.session = out, start_path, start, plan, session
        self.cwd = os.getcwd()
        self.observer: fanotify.Observer | None = None
        self.executable: set[str] = set()
        self.out_dir = -1  # OUT's directory, held from before the agent runs (see write_learned)

    @staticmethod
    def begin(
        args: Any, adl_document: dict[str, Any], plan: LaunchPlan, session: str, explain_only: bool, cgroup_group: str
    ) -> Learner | None:
        """None unless --learn; otherwise widen the plan (before the launch record is written)."""
        if not getattr(args, "learn", None):
            return None
        if args.production:
            raise PlanError("--learn is refused with --production: a learning run does not restrict files")
        learner = Learner(args.learn, args.adl, adl_document, plan, session)
        # What the start policy already lets run (resolved binaries, the baseline's loader).
        learner.executable = {path for path, rights in plan.landlock.rules if rights & landlock.EXECUTE}
        for layer in plan.layers:
            if layer.name in ("filesystem", "execution"):
                layer.status = "learning"  # type: ignore[assignment]
                layer.details.insert(
                    0, "LEARN MODE: observed with fanotify, NOT restricted (Landlock grants all, no mount is noexec)"
                )
        if not explain_only:
            everything = landlock.handled_fs(plan.landlock.abi)
            plan.landlock.rules.append(("/", everything))
            plan.exec_mounts = None  # the noexec mounts would stop what is to be learned from running
            try:
                learner.out_dir = os.open(args.learn.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                raise PlanError(f"--learn {args.learn}: its directory cannot be opened: {exc.strerror}") from None
            print(BANNER, file=sys.stderr)
            # The group adl-exec prepared the session's cgroup in (the cgroup_group setting).
            try:
                learner.observer = fanotify.Observer(f"/{cgroup_group}/{session}")
            except OSError as exc:
                raise PlanError(f"--learn needs fanotify (root, CAP_SYS_ADMIN): {exc}") from None
        return learner

    def finish(self, audit_dir: Path) -> dict[str, Any]:
        assert self.observer is not None
        seen = self.observer.stop()
        already_granted = granted_by_baseline(self.plan)
        tmpdir = self.plan.env.get("TMPDIR", "")
        session_tmp = tmpdir if tmpdir.startswith("/tmp/adl-session-tmp-") else None
        hosts = set()
        for record in iter_records(audit_dir):
            payload = record.get("payload") or {}
            if record.get("corr") != self.session or payload.get("decision") != "deny" or not payload.get("host"):
                continue
            hosts.add((str(payload["host"]), int(payload.get("port") or 443)))
        observations = learning.Observations(
            read=seen.read | seen.directories,
            written=seen.written,
            executed={p for p in seen.executed if p not in already_granted and p not in self.executable},
            hosts=hosts,
        )
        result = learning.learn(
            self.start,
            observations,
            cwd=self.cwd,
            already_granted=already_granted,
            ignore=[session_tmp] if session_tmp else [],
        )
        write_learned(self.out_dir, self.out.name, json.dumps(result.document, indent=2) + "\n")
        print(learning.diff(self.start, result.document, str(self.start_path), str(self.out)), end="")
        print(
            f"adl-exec: LEARN MODE: wrote {self.out}: {len(result.added_paths)} path(s), "
            f"{len(result.added_commands)} command(s), {len(result.added_hosts)} host(s) added "
            f"({seen.events} file events observed{', queue OVERFLOWED: incomplete' if seen.overflowed else ''}"
            f"{', forks not tracked: processes that ended at once may be missing' if seen.forks_untracked else ''}"
            f"{f', {seen.forks_forgotten} fork links FORGOTTEN: incomplete' if seen.forks_forgotten else ''}"
            f"{', TRUNCATED (the observer kept what its bounds allow): incomplete' if seen.truncated else ''})",
            file=sys.stderr,
        )
        notes = [*result.notes, *bounded_notes(seen)]
        for note in notes:
            print(f"adl-exec: LEARN MODE: {note}", file=sys.stderr)
        return {
            "decision": "allow",
            "rules": ["learn.result"],
            "learned_policy": escape_non_utf8(str(self.out)),  # the operator's name may not be UTF-8 either
            "added_paths": list(result.added_paths),
            "added_commands": list(result.added_commands),
            "added_hosts": list(result.added_hosts),
            "notes": notes,
            "overflowed": seen.overflowed,
            "forks_untracked": seen.forks_untracked,
            "truncated": seen.truncated,
            "forks_forgotten": seen.forks_forgotten,
            # every one, where the notes name the first CROWDED_NOTES: the agent chooses how many there
            # are (at most MAX_PATHS / MAX_NAMES_PER_DIRECTORY, each directory's names counting)
            "crowded_directories": crowded_directories(seen),
        }


CROWDED_NOTES = 20  # the crowded directories named one by one; the others are counted


def crowded_directories(seen: fanotify.Observed) -> list[str]:
    """Every crowded directory, by name, for the record."""
    return [escape_non_utf8(directory) for directory in sorted(seen.crowded)]


def bounded_notes(seen: fanotify.Observed) -> list[str]:
    """What the observer's bounds left out (fanotify.Observed.add), for the user and the record."""
    notes = []
    crowded = sorted(seen.crowded.items())
    for directory, kinds in crowded[:CROWDED_NOTES]:
        notes.append(
            f"{escape_non_utf8(directory)}: more than {fanotify.MAX_NAMES_PER_DIRECTORY} names "
            f"{'/'.join(sorted(kinds))}: only the first {fanotify.MAX_NAMES_PER_DIRECTORY} were kept (review: "
            "commands and names in a directory learn does not grant as a whole may be missing)"
        )
    if len(crowded) > CROWDED_NOTES:
        notes.append(
            f"{len(crowded) - CROWDED_NOTES} more crowded directories are not named here (of {len(crowded)}: "
            "all are in the learn.result record's crowded_directories)"
        )
    if seen.truncated:
        notes.append(
            f"TRUNCATED: the run touched more than {fanotify.MAX_PATHS} distinct paths (or "
            f"{fanotify.MAX_PATH_CHARACTERS} characters of them); the rest were not kept and the learned policy "
            "is incomplete"
        )
    if seen.forks_forgotten:
        notes.append(
            f"FORKS FORGOTTEN: {seen.forks_forgotten} fork links were dropped when the observer's table was "
            f"full ({fanotify.MAX_FORK_LINKS}); what a process gone before its events were read touched may be "
            "missing and the learned policy incomplete"
        )
    return notes


def write_learned(directory: int, name: str, text: str) -> None:
    """`text` as a new file `name` in `directory` (a descriptor held since before the agent ran),
    replacing whatever the name holds. The directory may be the agent's own, and the agent ran
    before this: a symlink or hard link it left at `name` is replaced, never written through, and a
    directory on the way it swapped for a symlink is not followed. Closes `directory`."""
    try:
        replace_file(directory, name, text.encode(), 0o644)
    finally:
        os.close(directory)


def granted_by_baseline(plan: LaunchPlan) -> list[str]:
    b = plan.baseline
    paths = [*b.read, *b.read_write, *b.read_device, *b.execute]
    return sorted({*paths, *(os.path.realpath(p) for p in paths)})
