"""A session cgroup of a test's own, for the tests that watch what runs in one (learn mode's
observer) without launching a sandbox."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from enforcer.sandbox import cgroups


@contextlib.contextmanager
def session_cgroup(group: str) -> Iterator[tuple[str, cgroups.Cgroup]]:
    """A new session cgroup below `group`, named uniquely: its path as /proc/<pid>/cgroup shows it,
    and the cgroup. Removed when the block ends, and `group` with it unless another run's session is
    still in it."""
    name = f"session-{uuid.uuid4().hex[:12]}"
    made = cgroups.create(name, Path("/sys/fs/cgroup"), group=group)
    try:
        yield f"/{group}/{name}", made
    finally:
        made.remove()
        for base in cgroups.group_directories(group=group):
            with contextlib.suppress(OSError):  # another run's session may still be in it
                base.rmdir()
