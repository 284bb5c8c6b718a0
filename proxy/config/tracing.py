"""Settings of the optional OpenTelemetry traces: where spans go, if anywhere.

Traces are off unless `otel_endpoint` is set: an `OTEL_EXPORTER_OTLP_*` variable in the environment alone never
turns them on, since a pod's environment often carries one for another container. Set, the endpoint is either a
collector's OTLP/HTTP base URL, or `env` to take it from the standard variables. The exporter needs the `otel`
extra; a proxy configured for traces without it stops at start-up saying how to install it.
"""

from __future__ import annotations

import importlib.util
from typing import Final
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

FROM_ENVIRONMENT: Final = "env"
"""The `otel_endpoint` that takes the endpoint from `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT` (default `http://localhost:4318`), as any OpenTelemetry SDK does."""

EXPORTER_MODULE: Final = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
"""The module that sends spans; installed by the `otel` extra with the SDK."""

INSTALL: Final = "pip install 'compaction-proxy[otel]'"


def exporter_installed() -> bool:
    """Whether the OTLP/HTTP exporter (and so the SDK it needs) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(EXPORTER_MODULE) is not None
    except (ImportError, ValueError):  # a parent package missing, or blocked in sys.modules
        return False


class TracingSettings(BaseModel):
    """The OTLP endpoint of the optional traces (see docs/tracing.md)."""

    otel_endpoint: str | None = Field(
        default=None,
        description=(
            "Send one OpenTelemetry span per model request (GenAI semantic conventions, with the proxy's decision;"
            " never content or keys) over OTLP/HTTP to this collector: its base URL (`http://collector:4318`; spans"
            " go to its `/v1/traces`), or `env` to use `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or"
            " `OTEL_EXPORTER_OTLP_ENDPOINT`. Unset: no traces, whatever the environment holds. Needs the `otel`"
            " extra."
        ),
    )

    @field_validator("otel_endpoint")
    @classmethod
    def _check_otel_endpoint(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        if value != FROM_ENVIRONMENT:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(
                    "expected the collector's OTLP/HTTP URL (http://collector:4318) or `env` for the"
                    " OTEL_EXPORTER_OTLP_* variables"
                )
        if not exporter_installed():
            raise ValueError(f"traces need the OpenTelemetry SDK and OTLP exporter, not installed here: {INSTALL}")
        return value
