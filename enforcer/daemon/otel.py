"""OpenTelemetry export of decisions and sessions (the `otel` extra; off unless the daemon's `otel`
setting is on).

One span per recorded decision, named adl-enforcer.check, child of the caller's W3C trace context
when the Check carried one (CheckRequest.trace), with the decision, its rules, the agent, the
session and the decision id (which names the audit record); and one span per launched session,
adl-enforcer.session, from its launch to its end, with the session, agent and uid. Spans go through a
BatchSpanProcessor, so exporting never waits on a collector; the OTLP exporter reads the standard
OTEL_EXPORTER_OTLP_* environment.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .core import DecisionEvent
from .registry import SessionRecord

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()


class DecisionSpans:
    def __init__(self, tracer_provider: Any | None = None) -> None:
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer("adl-enforcer")

    def observe(self, events: list[DecisionEvent]) -> None:
        end = time.time_ns()
        for event in events:
            parent = _PROPAGATOR.extract(event.trace) if event.trace else None
            span = self.tracer.start_span(
                "adl-enforcer.check",
                context=parent,
                kind=trace.SpanKind.INTERNAL,
                start_time=end - (event.eval_us + event.record_us) * 1000,
                attributes={
                    "adl.decision": event.decision,
                    "adl.rule": event.rules[0] if event.rules else "",
                    "adl.rules": list(event.rules),
                    "adl.agent": event.agent,
                    "adl.decision_id": event.decision_id,
                    "adl.session": event.session,
                    "adl.dry_run": event.dry_run,
                    "adl.audit_seq": event.audit_seq,
                },
            )
            if event.decision == "DENY":
                span.set_status(trace.Status(trace.StatusCode.OK, "denied by policy"))
            span.end(end_time=end)

    def session_ended(self, record: SessionRecord) -> None:
        try:
            span = self.tracer.start_span(
                "adl-enforcer.session",
                start_time=record.started_ms * 1_000_000,
                attributes={"adl.session": record.session, "adl.agent": record.agent, "adl.uid": record.uid},
            )
            span.end()
        except Exception:
            log.exception("a session span could not be exported")


def otlp_provider(service_name: str = "adl-enforcerd") -> Any:
    """A TracerProvider exporting over OTLP (gRPC) in the background."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
