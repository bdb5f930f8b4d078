"""Fleet telemetry for adl-enforcerd: installed only when configured (metrics_listen, otel).

Imported by the daemon only when one of them is set, so a daemon without the extras never loads
prometheus_client or opentelemetry. A setting whose extra is missing stops the daemon at start:
asked-for telemetry is never silently dropped.
"""

from __future__ import annotations

import threading
from typing import Any


def install(daemon: Any) -> list[Any]:
    """Attach the configured exporters to daemon.core.observers; returns what to close at stop."""
    settings = daemon.settings
    opened: list[Any] = []
    if settings.metrics_listen:
        from .prometheus import Metrics, directory_bytes

        def state() -> dict[str, Any]:
            return {
                "pending_approvals": len(daemon.approvals.pending()),
                "sessions": len(daemon.registry.all()),
                "audit_healthy": 1 if daemon.sink.healthy else 0,
                "audit_refusals": daemon.core.audit_refusals,
                "budget_refusals": daemon.core.budget_refusals,
                "log_bytes": directory_bytes(settings.audit_dir),
            }

        metrics = Metrics(state)
        daemon.core.observers.append(metrics.observe)
        opened.append(metrics.serve(settings.metrics_listen))
    if settings.otel:
        from .otel import DecisionSpans, otlp_provider

        provider = otlp_provider()
        spans = DecisionSpans(provider)
        daemon.core.observers.append(spans.observe)
        daemon.registry.on_end(spans.session_ended)
        opened.append(provider)
    return opened


FLUSH_S = 2.0  # a collector that is down must not hold the daemon's stop


def close(opened: list[Any]) -> None:
    """Stop the metrics server; flush the spans still queued, for FLUSH_S at most (what is left
    is dropped: the audit log holds every decision)."""
    for thing in opened:
        if hasattr(thing, "server_close"):
            thing.shutdown()
            thing.server_close()
            continue
        flusher = threading.Thread(target=thing.shutdown, name="otel-flush", daemon=True)
        flusher.start()
        flusher.join(FLUSH_S)
