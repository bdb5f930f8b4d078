"""A Prometheus endpoint for adl-enforcerd (the `prometheus` extra; off unless metrics_listen is set).

Counts and latencies come from Core.observers (after each decision's audit record is written);
pending approvals, sessions and the audit log's health and size are read at scrape time. The
audit log stays the record of truth: these are counters for dashboards and alerts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .core import DecisionEvent

# Decisions take microseconds and the audit append milliseconds: buckets cover both.
BUCKETS = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0)


class _State(Collector):
    """What is read when scraped rather than counted as it happens."""

    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        state = self.state()
        yield GaugeMetricFamily(
            "adl_enforcer_pending_approvals", "approvals waiting for a human", value=state["pending_approvals"]
        )
        yield GaugeMetricFamily(
            "adl_enforcer_sessions", "sessions the daemon launched and runs", value=state["sessions"]
        )
        yield GaugeMetricFamily(
            "adl_enforcer_audit_healthy", "1 while the audit log accepts records, else 0", value=state["audit_healthy"]
        )
        yield CounterMetricFamily(
            "adl_enforcer_audit_refusals",
            "requests answered UNAVAILABLE because the audit log could not record them",
            value=state["audit_refusals"],
        )
        yield CounterMetricFamily(
            "adl_enforcer_budget_refusals",
            "requests refused undecided because their caller uid had used its audit budget",
            value=state["budget_refusals"],
        )
        yield GaugeMetricFamily(
            "adl_enforcer_audit_log_bytes", "bytes in the audit log directory", value=state["log_bytes"]
        )


def directory_bytes(directory: Path) -> int:
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return total


class Metrics:
    def __init__(self, state: Callable[[], dict[str, Any]], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.checks = Counter(
            "adl_enforcer_checks", "decisions recorded", ["decision", "agent", "mode"], registry=self.registry
        )
        self.eval_seconds = Histogram(
            "adl_enforcer_check_eval_seconds", "time to decide one action", buckets=BUCKETS, registry=self.registry
        )
        self.record_seconds = Histogram(
            "adl_enforcer_check_record_seconds",
            "time to append the audit records a decision was written with",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_State(state))

    def observe(self, events: list[DecisionEvent]) -> None:
        for event in events:
            self.checks.labels(event.decision, event.agent, "dry_run" if event.dry_run else "enforce").inc()
            self.eval_seconds.observe(event.eval_us / 1e6)
            self.record_seconds.observe(event.record_us / 1e6)

    def serve(self, listen: str) -> Any:
        """Serve /metrics on HOST:PORT (a bare PORT listens on 127.0.0.1)."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry)
        return server
