"""The OTLP/HTTP exporter of request spans: the only module that imports OpenTelemetry, and only when configured.

Spans go through the SDK's `BatchSpanProcessor`: `emit` puts a finished span on a bounded queue (2048 spans,
`OTEL_BSP_MAX_QUEUE_SIZE`; past it spans are dropped, never waited for) and a thread of the SDK's posts them in
batches, so a slow or absent collector never holds a request. The exporter reads the standard variables for what
the proxy's settings do not name: `OTEL_EXPORTER_OTLP_HEADERS` (a collector's credentials stay out of the proxy's
settings), `_TIMEOUT`, `_COMPRESSION`, `_CERTIFICATE`, the `OTEL_BSP_*` batching and `OTEL_TRACES_SAMPLER`. The
service is `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`), `compaction-proxy` when neither
names one.
"""

from __future__ import annotations

import asyncio
from typing import Final

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy import __version__
from proxy.config.tracing import FROM_ENVIRONMENT
from proxy.server.tracing import RequestSpan

SERVICE: Final = "compaction-proxy"
"""`service.name` when the environment names none; also the instrumentation scope's name."""

TRACES_PATH: Final = "/v1/traces"
"""Where a collector's OTLP/HTTP receiver takes spans, under its base URL."""


def traces_url(endpoint: str) -> str | None:
    """The URL spans are posted to: `endpoint` + `/v1/traces` (kept when already there).

    None for the `env` endpoint: the SDK reads `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`.
    """
    if endpoint == FROM_ENVIRONMENT:
        return None
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def resource() -> Resource:
    """The environment's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) with the proxy's version.

    Named `compaction-proxy` when the environment names no service.
    """
    detected = Resource.create({SERVICE_VERSION: __version__})
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: SERVICE}))
    return detected


class OtlpSpans:
    """Request spans to an OTLP/HTTP collector, batched off the request path (a `SpanSink`).

    :param endpoint: The `otel_endpoint` setting: a collector's base URL, or `env`.
    """

    def __init__(self, endpoint: str) -> None:
        self.provider = TracerProvider(resource=resource(), shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self.provider.get_tracer(SERVICE, __version__)
        self.propagator = TraceContextTextMapPropagator()

    def emit(self, span: RequestSpan) -> None:
        """Record `span` as a CLIENT span, a child of the client's span when it sent a trace context."""
        started = self.tracer.start_span(
            span.name,
            context=self.propagator.extract(span.parent) if span.parent else None,
            kind=SpanKind.CLIENT,
            attributes=span.attributes,
            start_time=span.start_ns,
        )
        if span.error is not None:
            started.set_status(Status(StatusCode.ERROR))
        started.end(end_time=span.end_ns)

    async def aclose(self) -> None:
        """Send every span still queued (bounded by the export timeout), then stop.

        Off the event loop: the SDK's flush blocks.
        """
        await asyncio.to_thread(self.provider.shutdown)
