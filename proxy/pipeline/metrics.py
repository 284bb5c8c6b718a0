"""What compaction reports to Prometheus, beside the server's own request and latency metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.billing.bill import KINDS, Tokens
from proxy.pipeline.cache_misses import PROXY_CAUSES, Misses
from proxy.pipeline.tallies import counter

_TOKEN_BUCKETS = (1_000, 4_000, 16_000, 32_000, 64_000, 128_000, 200_000, 400_000, 1_000_000)
_ERROR_BUCKETS = (-0.5, -0.2, -0.1, -0.05, -0.02, 0, 0.02, 0.05, 0.1, 0.2, 0.5)


class CompactionMetrics:
    """Chat requests by what compaction did, compactions by strategy, tokens before and after, estimate error.

    :param registry: The app's registry; a private one when None (metrics are then collected but not served).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.requests = counter(
            "compaction_proxy_outcomes",
            "Requests of the wire formats the proxy compacts, each once, by format (api) and by what the pipeline first"
            " decided: compacted, unchanged, deferred (to a client that compacts itself), observed, skipped,"
            " unknown_window, provider_state, unparsed, too_deep (nested deeper than the proxy writes JSON: forwarded"
            " untouched), refused. compaction_proxy_decisions_total counts what the client was finally told.",
            ["api", "outcome"],
            registry=registry,
        )
        self.compactions = Counter(
            "compaction_proxy_compactions",
            "Compactions by the strategy that changed the conversation.",
            ["strategy"],
            registry=registry,
        )
        self.tokens_before = Histogram(
            "compaction_proxy_tokens_before",
            "Estimated request tokens before a compaction.",
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.tokens_after = Histogram(
            "compaction_proxy_tokens_after",
            "Estimated request tokens after a compaction.",
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.estimate_error = Histogram(
            "compaction_proxy_estimate_error_ratio",
            "(estimated - reported) / reported prompt tokens, for requests the proxy estimated.",
            buckets=_ERROR_BUCKETS,
            registry=registry,
        )
        self.exact_counts = Counter(
            "compaction_proxy_exact_counts",
            "Chat requests by how the upstream's exact count of their prompt went: cached (known before), counted"
            " (answered within exact_count_timeout), late (measured locally; the answer serves the next request),"
            " failed (no counting endpoint answered), implausible (ignored: too far from the local count), reported"
            " (not asked: a usage report covers all but a small tail), refused (not asked: the probe budget is spent).",
            ["result"],
            registry=registry,
        )
        self.probe_runs_refused = Counter(
            "compaction_proxy_probe_runs_refused",
            "Probe runs not started for want of budget (probe_runs_per_tenant_per_minute, probe_runs_per_minute), by"
            " kind (window: a discovery run, served with no discovered window; count: an exact count by a method that"
            " never answered, measured locally) and bound (tenant, overall).",
            ["kind", "bound"],
            registry=registry,
        )
        self.local_count_error = Histogram(
            "compaction_proxy_local_count_error_ratio",
            "(calibrated local estimate - exact count) / exact count, for requests the upstream counted exactly:"
            " what the estimate would have been off by without exact counting.",
            buckets=_ERROR_BUCKETS,
            registry=registry,
        )
        self.client_compaction = Counter(
            "compaction_proxy_client_compaction_requests",
            "Requests of a client that compacts itself, deferred to (compacted only when they would not fit), by the"
            " signal that showed it: compaction-request, compaction-items, context-management, codex-cli,"
            " claude-code, header, setting.",
            ["signal"],
            registry=registry,
        )
        self.retries = Counter(
            "compaction_proxy_overflow_retries",
            "Context-overflow answers retried after compacting, by result.",
            ["result"],
            registry=registry,
        )
        self.summaries_started = Counter(
            "compaction_proxy_summaries_started",
            "Summary calls started (ahead of time or when needed).",
            registry=registry,
        )
        self.summaries_used = Counter(
            "compaction_proxy_summaries_used", "Summaries applied in a compaction.", registry=registry
        )
        self.summaries_discarded = Counter(
            "compaction_proxy_summaries_discarded",
            "Summaries written but not used: not smaller than what they replace, or dropped unused.",
            registry=registry,
        )
        self.summary_fallbacks = Counter(
            "compaction_proxy_summary_fallbacks",
            "Compactions that fell back to the rest of the chain instead of a summary, by reason.",
            ["reason"],
            registry=registry,
        )
        self.summary_tokens = Counter(
            "compaction_proxy_summary_tokens",
            "Tokens (prompt and completion) spent on summary calls.",
            registry=registry,
        )
        self.implausible_usage = Counter(
            "compaction_proxy_implausible_usage_reports",
            "Provider usage reports ignored because they disagree with the local estimate beyond any tokenizer gap.",
            registry=registry,
        )
        self.offloaded_results = Counter(
            "compaction_proxy_offloaded_results",
            "Tool results offloaded to the state store (each distinct text once per compaction that wrote it).",
            registry=registry,
        )
        self.offload_bytes = Gauge(
            "compaction_proxy_offload_bytes_held",
            "UTF-8 bytes of offloaded results the in-memory state store holds (Redis reports its own memory).",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.offload_reads = Counter(
            "compaction_proxy_offload_reads",
            "Calls of the proxy's read tool it answered itself, by result: served (the held text), not_held,"
            " repeated (read earlier for the same request), too_large (past the round's bytes or the window) and"
            " left_out (past `offload_reads_per_answer`, or a repeat within one answer).",
            ["result"],
            registry=registry,
        )
        self.instructions_room = Counter(
            "compaction_proxy_instructions_without_room",
            "Requests to compact whose leading instructions and tools alone reach the target (over_target: the rest"
            " compacted as far as the rules allow) or exceed the window (over_window: forwarded as they came).",
            ["limit"],
            registry=registry,
        )
        self.offload_declined = Counter(
            "compaction_proxy_offload_declined",
            "Requests pruned instead of offloaded because the read tool could not be offered, by reason: name_taken"
            " (a client tool has its name), tool_limit (`offload_max_tools`).",
            ["reason"],
            registry=registry,
        )
        self.state_records_rejected = Counter(
            "compaction_proxy_state_records_rejected",
            "Records read from the state store and ignored as not fitting the request they were found for (a plan"
            " over another prefix, claiming more kept messages than it has, unreadable), by kind: rewrite, anchor.",
            ["kind"],
            registry=registry,
        )
        self.offload_evictions = Counter(
            "compaction_proxy_offload_evictions",
            "Offloaded results the in-memory store let go before their time, by reason: share (the writing tenant's"
            " own, beyond its share of state_offload_max_bytes), budget (the least recently used of anyone's),"
            " too_large (larger than the whole budget, not kept).",
            ["reason"],
            registry=registry,
        )
        self.offload_restored = Counter(
            "compaction_proxy_offload_restored",
            "Offloaded results no longer held that a read found in the conversation's re-sent original and stored"
            " again.",
            registry=registry,
        )
        self.cache_miss_tokens = counter(
            "compaction_proxy_cache_miss_tokens",
            "Prompt tokens the upstream reported as not served from its prompt cache, by format (api) and cause: new"
            " (the request's new messages), first (a conversation's first request), expiry (longer than the"
            " provider's cache lifetime since the conversation's previous request), client (the client changed its"
            " own prefix), compaction (the proxy's rewrite changed the prefix it forwards), provider (none of these).",
            ["api", "cause"],
            registry=registry,
        )
        self.proxy_cache_miss_tokens = counter(
            "compaction_proxy_proxy_cache_miss_tokens",
            "Of compaction_proxy_cache_miss_tokens_total, the tokens the proxy caused (cause compaction): the one"
            " figure to alert on.",
            registry=registry,
        )
        self.bill_tokens = counter(
            "compaction_proxy_bill_tokens",
            "Tokens the provider bills, by format (api), way (proxy: what it reported for each forwarded request;"
            " direct: the estimate of the same client requests sent as the client sent them, those that fit the"
            " window) and kind (uncached, cached, cache_write: input by how it is billed; output).",
            ["api", "way", "kind"],
            registry=registry,
        )
        self.errors = Counter(
            "compaction_proxy_compaction_errors",
            "Internal compaction errors; each forwarded the request unchanged (fail open).",
            registry=registry,
        )

    def decided(self, api: str, outcome: str) -> None:
        """Count one request of the wire format `api` by what compaction decided for it."""
        self.requests.add((api, outcome))

    def count_misses(self, api: str, misses: Misses) -> None:
        """Count a request's uncached prompt tokens by cause, and those the proxy caused."""
        for cause, tokens in misses.as_dict().items():
            if tokens:
                self.cache_miss_tokens.add((api, cause), tokens)
                if cause in PROXY_CAUSES:
                    self.proxy_cache_miss_tokens.add((), tokens)

    def count_bill(self, api: str, proxy: Tokens, direct: Tokens | None) -> None:
        """Count a request's billed tokens by kind, through the proxy and as estimated going direct (None: not)."""
        ways = (("proxy", proxy),) if direct is None else (("proxy", proxy), ("direct", direct))
        for way, billed in ways:
            for kind, tokens in zip(KINDS, billed, strict=True):
                if tokens:
                    self.bill_tokens.add((api, way, kind), tokens)

    def record_compaction(self, strategies: tuple[str, ...], tokens_before: int, tokens_after: int) -> None:
        """Count one compaction by strategy and tokens (a request's outcome is counted by `decided`)."""
        for strategy in strategies:
            self.compactions.labels(strategy).inc()
        self.tokens_before.observe(tokens_before)
        self.tokens_after.observe(tokens_after)
