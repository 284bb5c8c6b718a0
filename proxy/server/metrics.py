"""Prometheus metrics, on a registry of the app's own (never the process-global one).

A registry per app keeps test apps and several apps in one process apart. Under `workers` > 1 `/metrics` serves the
whole pod instead: every worker's values, summed (see `proxy.server.pod_metrics`). The compaction side adds its own
metrics (compactions by strategy, tokens before/after, estimate error) to the same registry, so `/metrics` serves
both: either it receives `registry` (see `ProxyMetrics.registry`) or the `Compaction` object offers
`register_metrics(registry)`, which `create_app` calls once.

The series counted on every request are tallies (`proxy.pipeline.tallies`): plain numbers added on the request's
path, rendered as prometheus_client renders its own metrics only when `/metrics` is scraped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from proxy.pipeline.tallies import counter, gauge, histogram
from proxy.server.pod_metrics import render_pod
from proxy.server.record import RequestRecord

LATENCY_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
"""Seconds; LLM calls range from milliseconds (models list) to minutes (long non-streamed generations)."""

UPSTREAM_ERRORS: Final = frozenset({"unreachable", "timeout", "broken_stream"})
"""The `RequestRecord.error` kinds that are the upstream's transport failing (`compaction_proxy_upstream_errors`)."""


class ProxyMetrics:
    """The transport's metrics. All names start with `compaction_proxy_`."""

    def __init__(self, registry: CollectorRegistry | None = None, *, pod_directory: str | None = None) -> None:
        """Create the metrics on `registry`, or on a fresh registry when None.

        :param pod_directory: The directory the pod's workers share their metrics through; `render` then serves
            their sum instead of this process's registry.
        """
        self.registry = registry if registry is not None else CollectorRegistry()
        """The registry this process's metrics live on; register further collectors here."""
        self.pod_directory = pod_directory
        self.requests = counter(
            "compaction_proxy_requests",
            "Requests answered, by route kind and HTTP status (499: client went away first).",
            ["route", "status"],
            registry=self.registry,
        )
        self.request_duration = histogram(
            "compaction_proxy_request_duration_seconds",
            "Time from request arrival to the end of the response (whole stream included), by route kind.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_latency = histogram(
            "compaction_proxy_upstream_latency_seconds",
            "Time from sending a request upstream to the upstream's response headers, by route kind.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.routed = counter(
            "compaction_proxy_upstream_requests",
            "Requests sent on each route, by the route's name (`upstream`: default, anthropic or an operator's route),"
            " route kind and the upstream's status (`none`: no answer, the transport failed or the client left).",
            ["upstream", "route", "status"],
            registry=self.registry,
        )
        self.upstream_errors = counter(
            "compaction_proxy_upstream_errors",
            "Upstream exchanges that failed in transport, by kind (unreachable, timeout, broken_stream).",
            ["kind"],
            registry=self.registry,
        )
        self.fail_open = Counter(
            "compaction_proxy_fail_open",
            "Chat requests forwarded unchanged because the compaction side failed, by stage (compact: deciding it"
            " failed, a state store that does not answer included; prepare, complete: the compaction side raised;"
            " inspect: inspecting the answer stream raised, the rest of it was relayed uninspected; count: shaping a"
            " client's prompt count raised, it was sent as it came).",
            ["stage"],
            registry=self.registry,
        )
        self.content_coding_refusals = Counter(
            "compaction_proxy_content_coding_refusals",
            "Compressed chat request bodies refused, by error code: invalid_content_encoding, too_many_gzip_members"
            " (gzip members or zstd frames past max_gzip_members), request_too_large. A coding the proxy cannot undo"
            " is not refused: it is forwarded as it came (X-Compaction: skipped).",
            ["code"],
            registry=self.registry,
        )
        self.retries = Counter(
            "compaction_proxy_retries",
            "Chat requests retried once with a new plan after the upstream refused the first (e.g. context overflow).",
            registry=self.registry,
        )
        self.usage_chunks_stripped = Counter(
            "compaction_proxy_usage_chunks_stripped",
            "Usage-only stream chunks the proxy asked for and removed before the client saw them.",
            registry=self.registry,
        )
        self.decisions = counter(
            "compaction_proxy_decisions",
            "Requests the compaction side saw, by route kind (the API) and what it did: the `X-Compaction` value"
            " sent back (compacted, unchanged, would-compact, deferred, skipped, unknown-window, error, ...).",
            ["route", "decision"],
            registry=self.registry,
        )
        self.window_sources = counter(
            "compaction_proxy_window_sources",
            "Requests the compaction side saw with a known context window, by where it came from: request, learned"
            " (from an overflow error), configured, discovered (asked of the upstream), table, default.",
            ["source"],
            registry=self.registry,
        )
        self.prompt_tokens = counter(
            "compaction_proxy_prompt_tokens",
            "Prompt tokens the upstream reported in the usage of the answers the compaction side saw.",
            registry=self.registry,
        )
        self.cached_prompt_tokens = counter(
            "compaction_proxy_cached_prompt_tokens",
            "Of compaction_proxy_prompt_tokens, those the upstream reported served from its prompt cache"
            " (`prompt_tokens_details.cached_tokens`, the Responses API's `input_tokens_details.cached_tokens`).",
            registry=self.registry,
        )
        self.in_flight = gauge(
            "compaction_proxy_in_flight_requests",
            "Requests being handled right now, streams included.",
            registry=self.registry,
        )

    def answered(self, record: RequestRecord, elapsed: float) -> None:
        """Count a finished request: its status and duration, its upstream exchange, the decision and window seen.

        :param elapsed: Seconds the request took.
        """
        route = record.route
        self.requests.add((route, str(record.status)))
        self.request_duration.observe((route,), elapsed)
        if record.upstream_latency is not None:
            self.upstream_latency.observe((route,), record.upstream_latency)
        if record.upstream is not None:
            status = str(record.upstream_status) if record.upstream_status is not None else "none"
            self.routed.add((record.upstream, route, status))
        if record.compaction is not None:
            self.decisions.add((route, record.compaction))
        if record.window_source is not None:
            self.window_sources.add((record.window_source,))
        if record.error in UPSTREAM_ERRORS:
            self.upstream_errors.add((record.error,))

    def count_usage(self, usage: Mapping[str, Any] | None) -> None:
        """Count the prompt tokens of an upstream usage report (chat field names), and how many were cached."""
        prompt = _tokens(usage.get("prompt_tokens")) if usage else None
        if usage is None or prompt is None:
            return
        self.prompt_tokens.add((), prompt)
        details = usage.get("prompt_tokens_details")
        cached = _tokens(details.get("cached_tokens")) if isinstance(details, Mapping) else None
        if cached:
            self.cached_prompt_tokens.add((), min(cached, prompt))

    def render(self) -> tuple[bytes, str]:
        """Return the exposition text (the pod's, under several workers) and its content type."""
        if self.pod_directory is not None:
            return render_pod(self.pod_directory), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _tokens(value: Any) -> int | None:
    """`value` when it is a token count (a non-negative int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
