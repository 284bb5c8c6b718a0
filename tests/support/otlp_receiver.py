"""An OTLP/HTTP trace receiver on loopback, decoding what it receives with the official `opentelemetry-proto` messages.

A real OpenTelemetry Collector is a Go binary that is not installable offline (it is not on PyPI, Debian or npm),
so this is the receiving half of the collector's `otlphttp` receiver, written to the OTLP/HTTP specification: it
takes `POST /v1/traces` with an `application/x-protobuf` body (gzip-coded when the exporter compresses), parses it
as `ExportTraceServiceRequest`, and answers `200` with an `ExportTraceServiceResponse`. Anything it cannot parse
is answered `400`, as a collector does, so a malformed export fails the test rather than passing silently.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

PROTOBUF = "application/x-protobuf"


def value_of(value: AnyValue) -> Any:
    """An attribute's value as Python: str, bool, int, float, or a list of them."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(item) for item in value.array_value.values]
    return getattr(value, kind) if kind is not None else None


def attributes_of(pairs: Any) -> dict[str, Any]:
    """Protobuf `KeyValue`s as a dict."""
    return {pair.key: value_of(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: the protobuf span, its attributes and its resource's."""

    span: Span
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]
    scope: str


class OtlpReceiver:
    """`async with OtlpReceiver() as receiver:` listens on 127.0.0.1; `receiver.endpoint` is its base URL."""

    def __init__(self) -> None:
        self.exports: list[ExportTraceServiceRequest] = []
        self._runner: web.AppRunner | None = None
        self.endpoint = ""

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.endpoint = f"http://{host}:{port}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            export = ExportTraceServiceRequest.FromString(body)
        except DecodeError:
            return web.Response(status=400, text="not an ExportTraceServiceRequest")
        self.exports.append(export)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF)

    @property
    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order received."""
        received = []
        for export in self.exports:
            for resource_spans in export.resource_spans:
                resource = attributes_of(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        received.append(
                            ReceivedSpan(span, attributes_of(span.attributes), resource, scope_spans.scope.name)
                        )
        return received
