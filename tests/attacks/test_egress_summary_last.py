"""net.summary is the last record of the egress filter's session: nothing written after it, and
what it counts includes every record written before it. A record is refused once the summary is
(AuditUnavailable: a DNS answer then goes unanswered), but that check came before the record's
write: one that passed it as the stop began was written after the summary (a TCP DNS query on a
pool thread, at the stop, say), its answer given, its query not in the summary's count."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import pytest

from ..unit.test_egress_process import Setup, audit_records, query


def test_a_record_begun_before_the_stop_is_written_before_the_summary(
    schemas: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DNS answer's record has passed the seal's check and is on its way to the writer (held
    there, as a thread preempted at that point would be) when the stop writes the summary."""
    setup = Setup(schemas, tmp_path)
    try:
        append, on_the_way, go_on = setup.writer.append, threading.Event(), threading.Event()

        def held_append(kind: str, payload: dict[str, Any], **kw: Any) -> Any:
            if kind == "net.dns":
                on_the_way.set()
                go_on.wait(10)
            return append(kind, payload, **kw)

        monkeypatch.setattr(setup.writer, "append", held_append)
        answers: list[bytes | None] = []
        asking = threading.Thread(target=lambda: answers.append(setup.server.answer(query("api.example.test"))))
        asking.start()
        assert on_the_way.wait(10)
        threading.Timer(0.3, go_on.set).start()  # the record goes on while the stop is under way
        summary = setup.server.stop({}, wait_s=5.0)
        go_on.set()
        asking.join(10)
        assert not asking.is_alive()
        setup.writer.sync()
        order = [r["intent"].removeprefix("adl.enforcer.") for r in audit_records(setup.log)]
        assert order[-1] == "net.summary", order  # the answer's record came before it
        assert answers and answers[0] is not None
        assert dns.message.from_wire(answers[0]).rcode() == dns.rcode.NOERROR
        assert summary["dns"]["queries"] == 1, summary  # and is counted in it
    finally:
        setup.close()
