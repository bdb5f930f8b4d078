"""run_session when the launch itself fails: the kernel-denial reader it started is finished (its
thread and netlink socket stopped, what it saw recorded) and the launch's own error is raised."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from enforcer import session
from enforcer.audit import AuditWriter
from enforcer.sandbox import launcher

from ..helpers.documents import base_adl, compile_doc


class Reader:
    def __init__(self, fails: bool = False) -> None:
        self.finished = 0
        self.fails = fails

    def finish(self) -> dict[str, Any]:
        self.finished += 1
        if self.fails:
            raise OSError("the reader's socket is gone")
        return {"available": False, "why": "test"}


def plan() -> Any:
    return SimpleNamespace(
        secrets=(),
        argv=["true"],
        executable="/bin/true",
        layers=[],
        accepted_unenforced=[],
        baseline=SimpleNamespace(path=Path("/nonexistent/baseline.yaml"), digest="sha256:0"),
        env={},
        env_dropped=[],
    )


@pytest.mark.parametrize("reader_fails", [False, True])
def test_a_failed_launch_finishes_the_kernel_denials_and_raises_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schemas: Any, reader_fails: bool
) -> None:
    reader = Reader(fails=reader_fails)
    monkeypatch.setattr(session.SessionDenials, "start", staticmethod(lambda *args, **kw: reader))

    def fails(*args: Any, **kw: Any) -> Any:
        raise launcher.LaunchError("sandbox setup failed: the egress filter did not start")

    monkeypatch.setattr(session, "_run", fails)
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    try:
        with pytest.raises(launcher.LaunchError, match="egress filter did not start"):
            session.run_session(compile_doc(schemas, base_adl()), plan(), writer, "s-failed", uid=54321, gid=54321)
    finally:
        writer.close()
    assert reader.finished == 1
