"""Fleet telemetry: spans per decision (in-memory exporter) and the daemon's Prometheus endpoint."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("prometheus_client")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from enforcer.audit import WriterSettings
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.core import Core
from enforcer.daemon.otel import DecisionSpans
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import FAST_AAIF, TOOLS, RunningDaemon, tool_request
from ..helpers.sandbox import Sandbox

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def core(tmp_path: Path, schemas: Any) -> Iterator[Core]:
    policies = tmp_path / "policies"
    policies.mkdir()
    doc = {
        "adl_spec": "0.3.0",
        "name": "Fast",
        "description": "telemetry test",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
        "tools": TOOLS,
    }
    (policies / "fast.adl.json").write_text(json.dumps(doc))
    (policies / "fast.aaif.json").write_text(json.dumps(FAST_AAIF))
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    sink = AuditSink(tmp_path / "audit", tmp_path / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    try:
        yield Core(store, sink, SessionRegistry(), Approvals(lambda: 0, 10), lambda: 0)
    finally:
        sink.close()


def test_a_span_per_decision_joins_the_callers_trace(core: Core) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    core.observers.append(DecisionSpans(provider).observe)
    traced = pb.TraceContext(traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01")
    allowed = core.check(tool_request("Fast", "read_note", {"name": "a"}, trace=traced))
    denied = core.check(tool_request("Fast", "shell", {}))
    asked = core.check(tool_request("Fast", "delete_note", {"name": "a"}))

    spans = {s.attributes["adl.decision_id"]: s for s in exporter.get_finished_spans()}
    assert set(spans) == {allowed.decision_id, denied.decision_id, asked.decision_id}
    span = spans[allowed.decision_id]
    assert span.name == "adl-enforcer.check"
    assert f"{span.context.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.attributes["adl.decision"] == "ALLOW" and span.attributes["adl.agent"] == allowed.agent
    assert span.attributes["adl.audit_seq"] == allowed.receipt.seq
    assert spans[denied.decision_id].attributes["adl.rule"] == "tool.undeclared"
    assert spans[denied.decision_id].parent is None  # no trace context: a root span
    assert spans[asked.decision_id].attributes["adl.decision"] == "ASK"


def test_a_span_per_session_from_launch_to_end() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = SessionRegistry()
    registry.on_end(DecisionSpans(provider).session_ended)
    started_ms = time.time_ns() // 1_000_000 - 1500
    record = registry.register("Fast", None, 1000, 1000, ("python3", "agent.py"), started_ms)
    registry.end(record.session)
    (span,) = exporter.get_finished_spans()
    assert span.name == "adl-enforcer.session"
    assert dict(span.attributes) == {"adl.session": record.session, "adl.agent": "Fast", "adl.uid": 1000}
    assert span.start_time == started_ms * 1_000_000 and span.end_time - span.start_time >= 1_500_000_000


def test_a_failing_observer_never_changes_a_decision(core: Core) -> None:
    def broken(events: list[Any]) -> None:
        raise RuntimeError("collector down")

    core.observers.append(broken)
    assert core.check(tool_request("Fast", "read_note", {"name": "a"})).decision == pb.ALLOW


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.daemon
def test_the_daemon_serves_metrics_when_asked(tmp_path: Path) -> None:
    d = RunningDaemon(tmp_path, Sandbox(tmp_path / "box"))
    d.write_agents()
    port = _free_port()
    d.extra_env["ADL_ENFORCER_METRICS_LISTEN"] = f"127.0.0.1:{port}"
    try:
        d.start()
        stub = d.enforcer()
        stub.Check(tool_request("Fast", "read_note", {"name": "a"}))
        stub.Check(tool_request("Fast", "read_note", {"name": "b"}))
        stub.Check(tool_request("Fast", "shell", {}))
        stub.Check(tool_request("Fast", "delete_note", {"name": "a"}))
        metrics = _scrape(port)
    finally:
        d.cleanup()
    agent = "Fast"  # the agent key: its name
    counted = {k: v for k, v in metrics.items() if k[0] == "adl_enforcer_checks_total"}
    assert counted[("adl_enforcer_checks_total", (("agent", agent), ("decision", "ALLOW"), ("mode", "enforce")))] == 2
    assert counted[("adl_enforcer_checks_total", (("agent", agent), ("decision", "DENY"), ("mode", "enforce")))] == 1
    assert counted[("adl_enforcer_checks_total", (("agent", agent), ("decision", "ASK"), ("mode", "enforce")))] == 1
    assert metrics[("adl_enforcer_check_eval_seconds_count", ())] == 4
    assert metrics[("adl_enforcer_check_record_seconds_count", ())] == 4
    assert metrics[("adl_enforcer_pending_approvals", ())] == 1
    assert metrics[("adl_enforcer_sessions", ())] == 0
    assert metrics[("adl_enforcer_audit_healthy", ())] == 1
    assert metrics[("adl_enforcer_audit_refusals_total", ())] == 0
    assert metrics[("adl_enforcer_budget_refusals_total", ())] == 0  # root's Checks are not budgeted
    assert metrics[("adl_enforcer_audit_log_bytes", ())] > 0


def test_without_telemetry_settings_nothing_is_imported() -> None:
    probe = (
        "import sys, enforcer.daemon.daemon, enforcer.cli.enforcerd, enforcer.client\n"
        "from enforcer.daemon.config import Settings\n"
        "s = Settings()\n"
        "assert not s.metrics_listen and not s.otel\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prometheus_client', 'opentelemetry', 'mcp', 'langchain_core'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.daemon
def test_an_unreachable_collector_never_delays_a_decision(tmp_path: Path) -> None:
    d = RunningDaemon(tmp_path, Sandbox(tmp_path / "box"))
    d.write_agents()
    d.extra_env.update({"ADL_ENFORCER_OTEL": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_free_port()}"})
    try:
        d.start()
        stub = d.enforcer()
        stub.Check(tool_request("Fast", "read_note", {"name": "warm"}))
        started = time.monotonic()
        for i in range(200):
            assert stub.Check(tool_request("Fast", "read_note", {"name": str(i)}), timeout=5).decision == pb.ALLOW
        elapsed = time.monotonic() - started
        stopping = time.monotonic()
        assert d.stop() == 0
        stop_s = time.monotonic() - stopping
    finally:
        d.cleanup()
    assert elapsed < 10, f"200 Checks took {elapsed:.1f} s with the collector down"
    assert stop_s < 5, f"the daemon took {stop_s:.1f} s to stop"  # spans flushed for 2 s at most


@pytest.mark.daemon
def test_a_metrics_endpoint_that_cannot_listen_stops_the_daemon(tmp_path: Path) -> None:
    d = RunningDaemon(tmp_path, Sandbox(tmp_path / "box"))
    d.write_agents()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        d.extra_env["ADL_ENFORCER_METRICS_LISTEN"] = f"127.0.0.1:{taken.getsockname()[1]}"
        try:
            d.start(wait=False)
            assert d.proc is not None
            code = d.proc.wait(timeout=30)
        finally:
            d.cleanup()
    assert code != 0
    assert "telemetry" in d.log.read_text()
