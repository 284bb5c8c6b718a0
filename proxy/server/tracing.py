"""One OpenTelemetry span per model request, in the GenAI semantic conventions, with the proxy's decision beside.

The span is built from the request's `RequestRecord` once the request is over (`trace_request`, called by the
accounting middleware), so it costs the request path one dictionary and a queue put: the exporter
(`proxy.server.otel_export`, the only module that imports OpenTelemetry) sends spans in batches from a thread of
its own, drops what does not fit its bounded queue, and flushes when the app shuts down. Nothing here runs, and
OpenTelemetry is never imported, unless `otel_endpoint` is set.

The attribute names follow the GenAI semantic conventions of open-telemetry/semantic-conventions-genai v0.1.0 (the
`gen_ai.client.inference` span; `gen_ai.provider.name`, which replaced `gen_ai.system`), and the stable `server.*`,
`error.type` and `http.response.status_code`. What the proxy decided goes under `compaction_proxy.*`. A span
carries counts, names and ids only: never a message, a tool result or a credential (docs/tracing.md lists every
attribute).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from aiohttp import web

from proxy.failures import log_failure
from proxy.formats import format_of
from proxy.server.keys import ROUTE, SETTINGS
from proxy.server.logging import SERVER_LOGGER
from proxy.server.record import RequestRecord

log = logging.getLogger(SERVER_LOGGER)

Value = str | bool | int | list[str]
"""An attribute's value, as OpenTelemetry takes it."""

OPERATION: Final = "chat"
"""`gen_ai.operation.name` of chat completions, Responses and Messages alike (the conventions' name for all three)."""

OURS: Final = "compaction_proxy."
"""The namespace of the proxy's own attributes."""

CACHE_MISS: Final = OURS + "cache_miss."
"""Prefix of the prompt tokens not served from the provider's cache, one attribute per cause
(`RequestRecord.cache_misses`)."""

COMPACTED: Final = frozenset({"compacted", "compacted-after-overflow"})
"""Decisions (`X-Compaction`) whose forwarded conversation is a compacted view: `gen_ai.conversation.compacted`."""


@dataclass(frozen=True)
class RequestSpan:
    """A finished request as one span: what the exporter sends, without any OpenTelemetry type.

    :param name: `{gen_ai.operation.name} {gen_ai.request.model}` (the operation alone when the model is unknown).
    :param start_ns: When the request arrived, in nanoseconds since the epoch.
    :param end_ns: When it was over.
    :param attributes: The span's attributes.
    :param error: `error.type` when the request failed (the span's status is then ERROR).
    :param parent: The client's W3C trace context headers (`traceparent`, `tracestate`), so the span joins the
        client's trace; empty when it sent none.
    """

    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Value]
    error: str | None = None
    parent: dict[str, str] = field(default_factory=dict)


class SpanSink(Protocol):
    """Where finished request spans go (`proxy.server.otel_export.OtlpSpans`)."""

    def emit(self, span: RequestSpan) -> None:
        """Queue the span for export; must not block or raise."""
        ...

    async def aclose(self) -> None:
        """Send what is queued, then stop."""
        ...


TRACER = web.AppKey("tracer", SpanSink)
"""The app's span sink; present only while traces are configured (`otel_endpoint`)."""


async def exporter(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context: the OTLP exporter from startup to cleanup when `otel_endpoint` is set, else nothing.

    On cleanup (after in-flight requests are done) the exporter sends what it still holds.
    """
    endpoint = app[SETTINGS].otel_endpoint
    if endpoint is None:
        yield
        return
    from proxy.server.otel_export import OtlpSpans  # OpenTelemetry is imported only when traces are configured

    sink = OtlpSpans(endpoint)
    app[TRACER] = sink
    try:
        yield
    finally:
        await sink.aclose()


def trace_request(request: web.Request, record: RequestRecord) -> None:
    """Hand the finished request's span to the exporter, if traces are on and it was a model request.

    A failure here is logged and swallowed: a span is never worth a request.
    """
    sink = request.app.get(TRACER)
    if sink is None:
        return
    try:
        span = span_of(request, record)
        if span is not None:
            sink.emit(span)
    except Exception as exc:
        log_failure(log, "building the request's trace span failed; the request is unaffected", exc)


def span_of(request: web.Request, record: RequestRecord) -> RequestSpan | None:
    """The span of a request of a format the proxy compacts (chat completions, Responses, Messages); None for others."""
    wire = format_of(request.method, request.path)
    if wire is None:
        return None
    attributes: dict[str, Value] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": wire.api,
        **_server(request),
        **gen_ai_figures(record),
        **proxy_figures(record),
    }
    error = error_type(record)
    if error is not None:
        attributes["error.type"] = error
    end = time.time_ns()
    parent = {name: request.headers[name] for name in ("traceparent", "tracestate") if name in request.headers}
    name = f"{OPERATION} {record.model}" if record.model else OPERATION
    return RequestSpan(name, end - int(record.elapsed() * 1e9), end, attributes, error, parent)


def gen_ai_figures(record: RequestRecord) -> dict[str, Value]:
    """The conventions' request and usage attributes the record holds (each only when known)."""
    figures: dict[str, Value | None] = {
        "gen_ai.request.model": record.model,
        "gen_ai.request.stream": record.stream or None,
        "gen_ai.conversation.id": record.conversation_id,
        "gen_ai.conversation.compacted": True if record.compaction in COMPACTED else None,
        "gen_ai.usage.input_tokens": record.prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": record.cached_tokens,
        "gen_ai.usage.output_tokens": record.completion_tokens,
        "http.response.status_code": record.status,
    }
    return {name: value for name, value in figures.items() if value is not None}


def proxy_figures(record: RequestRecord) -> dict[str, Value]:
    """What the proxy decided and measured, under `compaction_proxy.*` (each only when known)."""
    figures: dict[str, Value | None] = {
        "decision": record.compaction,
        "tokens_before": record.tokens_before,
        "tokens_after": record.tokens_after,
        "strategies": record.strategies.split(",") if record.strategies else None,
        "context_window": record.context_window,
        "window_source": record.window_source,
        "route": record.upstream,
        "request_id": record.request_id,
        "upstream_status": record.upstream_status,
        "fail_open": list(record.fail_open) or None,
        "retried": record.retried or None,
    }
    ours = {OURS + name: value for name, value in figures.items() if value is not None}
    return {**ours, **cache_misses(record.cache_misses.as_dict() if record.cache_misses else {})}


def cache_misses(tokens_by_cause: Mapping[str, int]) -> dict[str, Value]:
    """`compaction_proxy.cache_miss.<cause>`: the uncached prompt tokens attributed to each cause."""
    return {CACHE_MISS + cause: tokens for cause, tokens in tokens_by_cause.items()}


def error_type(record: RequestRecord) -> str | None:
    """`error.type`: the proxy's own error kind (`timeout`, `unreachable`, ...), else the failing HTTP status."""
    if record.error is not None:
        return record.error
    if record.status is not None and record.status >= 400:
        return str(record.status)
    return None


def _server(request: web.Request) -> dict[str, Value]:
    """`server.address` and `server.port`: the upstream the request's route sent it to."""
    route = request.get(ROUTE)
    if route is None:
        return {}
    base = route.upstream.base
    address: dict[str, Value] = {"server.address": base.host} if base.host else {}
    if base.port is not None:
        address["server.port"] = base.port
    return address
