"""A writer's flusher failed for want of descriptors: the tests of the audit writer out of
process resources (tests/unit/test_audit_writer_limits.py) and of what a failed writer gives back
(tests/attacks/test_audit_lease_on_failure.py)."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator

import pytest

from enforcer.audit import AuditWriter, records


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[None]:
    """Every descriptor the process may open is taken (a lowered soft limit keeps that cheap)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, len(os.listdir("/proc/self/fd")) + 64), hard))
    try:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                break
        with pytest.raises(OSError, match="Too many open files"):
            os.dup(0)
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fail_the_flusher(writer: AuditWriter) -> None:
    """Append once, then take every descriptor until the writer's background flusher, finding none
    to sync the append with, fails the writer; its flusher has ended when this returns."""
    writer.append(records.DECISION, {"decision": "allow"})
    with no_descriptor_left():
        deadline = time.monotonic() + 10
        while writer.failed is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert isinstance(writer.failed, OSError), writer.failed
    assert writer._flusher is not None
    writer._flusher.join(timeout=5)
