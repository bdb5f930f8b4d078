"""Learn mode's policy writer (pure): from what a run was seen doing, the smallest ADL document that
would have allowed it, as the start document plus grants, and a diff between the two.

Paths the runtime baseline or the presets already grant, the session's own temp directory, and
/proc, /dev and /sys are left out. Everything under the working directory collapses to `<cwd>/**`;
elsewhere the shallowest directory at least three levels deep with `collapse_at` distinct entries
seen below it becomes `dir/**` (so never /etc/** or /home/me/**); a written file grants read_write
on its directory (creating and renaming are rights on the directory). Executables become
allowed commands by absolute path; a shell is listed with allow_shell set, and said so. Hosts are
those the egress filter denied during the run. A name that is not UTF-8 (the agent may choose any
bytes) cannot be written in a document: it is left out, and a note names it with its bytes as \\xNN.
"""

from __future__ import annotations

import copy
import difflib
import json
import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any

from ..quick_dataclass import dataclass
from ..text import escape_non_utf8
from .decider import SHELLS

_NEVER = ("/proc", "/dev", "/sys", "/run/adl-enforcer")


@dataclass
class Observations:
    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    executed: set[str] = field(default_factory=set)
    hosts: set[tuple[str, int]] = field(default_factory=set)


@dataclass(frozen=True)
class Learned:
    document: dict[str, Any]
    added_paths: tuple[dict[str, str], ...]
    added_commands: tuple[str, ...]
    added_hosts: tuple[str, ...]
    added_ports: tuple[int, ...]
    notes: tuple[str, ...]


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _unnamable(text: str, notes: list[str]) -> bool:
    """Whether `text` holds bytes that are not UTF-8; if so, say it was left out."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        notes.append(
            f"{escape_non_utf8(text)} not granted: its name is not UTF-8, which a policy document cannot hold "
            "(grant a directory above it by hand if the agent needs it)"
        )
        return True
    return False


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def collapse(paths: Iterable[str], cwd: str, collapse_at: int = 3, min_depth: int = 3) -> list[str]:
    """Patterns covering `paths`: `<cwd>/**` for everything under the working directory; the
    shallowest directory at least `min_depth` deep (never /etc, /home/me, /root/.ssh) with
    `collapse_at` distinct entries seen below it becomes `dir/**`; other paths stay literal."""
    # Never widen to a top-level directory (a run started in / or /home would grant it all).
    cwd_glob = _depth(cwd) >= 2
    chosen: list[str] = []
    rest: set[str] = set()
    for path in paths:
        if cwd_glob and _under(path, [cwd]):
            chosen.append(cwd.rstrip("/"))
        else:
            rest.add(path.rstrip("/") or "/")
    children: dict[str, set[str]] = defaultdict(set)
    for path in rest:
        parts = path.split("/")
        for i in range(2, len(parts)):
            children["/".join(parts[:i])].add(parts[i])
    for directory in sorted(children, key=lambda d: (_depth(d), d)):
        if _depth(directory) < min_depth or len(children[directory]) < collapse_at:
            continue
        if not _under(directory, chosen):
            chosen.append(directory)
    globs = sorted({c + "/**" for c in chosen})
    literals = sorted(p for p in rest if not _under(p, chosen))
    return sorted(globs + literals)


def learn(
    start: Mapping[str, Any],
    seen: Observations,
    *,
    cwd: str,
    already_granted: Iterable[str],
    ignore: Iterable[str] = (),
) -> Learned:
    document = copy.deepcopy(dict(start))
    permissions = document.setdefault("permissions", {})
    skip = [*_NEVER, *already_granted, *ignore]
    notes: list[str] = []

    written = {p for p in seen.written if not _under(p, skip)}
    read = {p for p in seen.read if not _under(p, skip)} - written
    fs = permissions.setdefault("filesystem", {})
    existing = fs.setdefault("allowed_paths", [])
    have = {(e.get("path"), e.get("access")) for e in existing if isinstance(e, dict)}
    added_paths: list[dict[str, str]] = []
    # Creating, renaming and removing are rights on the directory: a written file grants its
    # directory (the working directory's glob when it is inside it).
    cwd_glob = _depth(cwd) >= 2
    write_dirs = sorted({posixpath.dirname(p) for p in written})
    write_patterns = sorted(
        {cwd.rstrip("/") + "/**" if cwd_glob and _under(d, [cwd]) else d.rstrip("/") + "/**" for d in write_dirs}
    )
    write_patterns = [w for w in write_patterns if not _under(w[:-3], [x[:-3] for x in write_patterns if x != w])]
    notes.extend(
        f"{w} read_write: the run wrote directly in a top-level directory (review: it grants all of it)"
        for w in write_patterns
        if _depth(w[:-3]) < 2
    )
    write_roots = [w[:-3] for w in write_patterns]
    for access, patterns in (("read_write", write_patterns), ("read", collapse(read, cwd))):
        for pattern in patterns:
            if access == "read" and _under(pattern.removesuffix("/**"), write_roots):
                continue
            if (pattern, access) in have or (pattern, "read_write") in have or _unnamable(pattern, notes):
                continue
            entry = {"path": pattern, "access": access}
            existing.append(entry)
            added_paths.append(entry)
    if not existing:
        del fs["allowed_paths"]
    if not fs:
        del permissions["filesystem"]

    added_commands: list[str] = []
    commands = [p for p in sorted(seen.executed) if not _under(p, [*_NEVER, *ignore])]
    if commands:
        execution = permissions.setdefault("execution", {})
        allowed = execution.setdefault("allowed_commands", [])
        for path in commands:
            name = posixpath.basename(path)
            if path in allowed or name in allowed or _unnamable(path, notes):
                continue
            if name in SHELLS and not execution.get("allow_shell"):
                execution["allow_shell"] = True
                notes.append(f"{path} is a shell: allow_shell set to true (review: shells run anything)")
                continue
            allowed.append(path)
            added_commands.append(path)

    added_hosts: list[str] = []
    added_ports: list[int] = []
    if seen.hosts:
        network = permissions.setdefault("network", {})
        hosts = network.setdefault("allowed_hosts", [])
        ports = network.get("allowed_ports")
        for host, port in sorted(seen.hosts):
            if host not in hosts:
                hosts.append(host)
                added_hosts.append(host)
            if ports is not None and port not in ports:
                ports.append(port)
                added_ports.append(port)
    # Notes quote paths the run saw, whatever their bytes: they go to the audit log too.
    return Learned(
        document,
        tuple(added_paths),
        tuple(added_commands),
        tuple(added_hosts),
        tuple(added_ports),
        tuple(escape_non_utf8(n) for n in notes),
    )


def diff(start: Mapping[str, Any], learned: Mapping[str, Any], start_name: str, out_name: str) -> str:
    before = json.dumps(start, indent=2, sort_keys=True).splitlines(keepends=True)
    after = json.dumps(learned, indent=2, sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, start_name, out_name))
