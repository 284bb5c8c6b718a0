"""What one request did, filled in by the handlers and written out once by the access-log middleware."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from random import Random
from typing import Any, Final

from proxy.pipeline.cache_misses import Misses
from proxy.pipeline.ledger import CONVERSATION_HEADER
from proxy.pipeline.reports import WINDOW_SOURCE_HEADER

_IDS = Random()
"""Where request ids come from: a generator of the proxy's own, seeded by the system at start and again in each forked
worker, so that a process seeding the `random` module (a test framework does, per example) repeats no ids."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDS.seed)


def _new_request_id() -> str:
    """16 random hex digits, from `_IDS`.

    The id only tells one request's lines from another's: it guards nothing, and `os.urandom` is a system call per
    request.
    """
    return f"{_IDS.getrandbits(64):016x}"


@dataclass(slots=True)
class RequestRecord:
    """Facts about one request: no bodies and no header values other than the conversation id and the model.

    `request_id` is new per request and names it in every line logged while it is handled (`REQUEST_ID`).

    :param method: HTTP method.
    :param route: Route kind (bounded label).
    :param conversation_id: Value of the configured conversation header, else of one its format's clients send
        (`WireFormat.conversation_headers`), if present (truncated).
    """

    method: str
    route: str
    conversation_id: str | None = None
    request_id: str = field(default_factory=_new_request_id)
    upstream: str | None = None
    """The name of the route the request took, once it was chosen (`proxy.server.routing`)."""
    model: str | None = None
    compaction: str | None = None
    """What compaction did (the `X-Compaction` value sent back)."""
    window_source: str | None = None
    """Where the context window the decision used came from (the `X-Compaction-Window-Source` value sent back)."""
    tokens_before: int | None = None
    tokens_after: int | None = None
    strategies: str | None = None
    """The strategies that changed the conversation, comma-separated (the `X-Compaction-Strategies` value)."""
    context_window: int | None = None
    stream: bool = False
    """The request asked for a streamed answer."""
    prompt_tokens: int | None = None
    """Prompt tokens the upstream reported (cached ones included), over every upstream call made for the request."""
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    conversation_hash: str | None = None
    """The conversation's id in the ledger (the `X-Compaction-Conversation` value sent back), a hash."""
    cache_misses: Misses | None = None
    """The answer's uncached prompt tokens by cause (`ForwardPlan.cache_misses`), once its usage was recorded; the
    access line shows them, the trace span carries each as `compaction_proxy.cache_miss.<cause>`."""
    started: float = field(default_factory=time.perf_counter)
    status: int | None = None
    upstream_status: int | None = None
    upstream_latency: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    fail_open: list[str] = field(default_factory=list)
    retried: bool = False
    stripped_usage: bool = False
    answered: bool = False
    """The whole answer was written, its end included: a client that closes its connection after that (curl does,
    while the proxy still records the answer's usage) left nothing unanswered."""
    client_disconnected: bool = False
    error: str | None = None

    def decided(self, headers: Mapping[str, str]) -> None:
        """Note what the compaction side told the client (its response headers), for the access line and metrics.

        Called again for the plan of a retry, whose headers replace the first plan's where it sends them.
        """
        self.compaction = headers.get("X-Compaction", self.compaction)
        self.window_source = headers.get(WINDOW_SOURCE_HEADER, self.window_source)
        self.conversation_hash = headers.get(CONVERSATION_HEADER, self.conversation_hash)
        self.tokens_before = _count(headers.get("X-Compaction-Tokens-Before")) or self.tokens_before
        self.tokens_after = _count(headers.get("X-Compaction-Tokens-After")) or self.tokens_after
        self.strategies = headers.get("X-Compaction-Strategies", self.strategies)
        self.context_window = _count(headers.get("X-Compaction-Context-Window")) or self.context_window

    def used(self, usage: Mapping[str, Any] | None) -> None:
        """Add an upstream call's usage report (chat completion field names) to the request's token counts."""
        if not usage:
            return
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        self.prompt_tokens = _added(self.prompt_tokens, usage.get("prompt_tokens"))
        self.cached_tokens = _added(self.cached_tokens, cached)
        self.completion_tokens = _added(self.completion_tokens, usage.get("completion_tokens"))

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.started

    def access_fields(self, path: str, elapsed: float) -> dict[str, Any]:
        """The access line's fields, in their order, each only when known (a false flag, an empty list: unknown).

        :param path: The raw path the client asked for.
        :param elapsed: Seconds the request took.
        """
        fields: dict[str, Any] = {"method": self.method, "path": path, "route": self.route}
        if self.upstream is not None:
            fields["upstream"] = self.upstream
        if self.status is not None:
            fields["status"] = self.status
        if self.upstream_status is not None:
            fields["upstream_status"] = self.upstream_status
        fields["latency_ms"] = round(elapsed * 1000, 1)
        if self.upstream_latency is not None:
            fields["upstream_latency_ms"] = round(self.upstream_latency * 1000, 1)
        fields["bytes_in"] = self.bytes_in
        fields["bytes_out"] = self.bytes_out
        for name in _KNOWN_WHEN_SET:
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        if self.cache_misses is not None:
            fields["cache_misses"] = self.cache_misses.shown() or "none"
        for name in _FLAGS:
            if getattr(self, name):
                fields[name] = True
        if self.fail_open:
            fields["fail_open"] = ",".join(self.fail_open)
        if self.client_disconnected:
            fields["client_disconnected"] = True
        if self.error is not None:
            fields["error"] = self.error
        return fields


_KNOWN_WHEN_SET: Final = (
    "conversation_id",
    "model",
    "compaction",
    "tokens_before",
    "tokens_after",
    "conversation_hash",
)
"""Access line fields shown as they are, when not None (in this order, after the byte counts)."""
_FLAGS: Final = ("retried", "stripped_usage")
"""Access line flags shown (as true) when set, after the cache misses."""


def _count(header: str | None) -> int | None:
    """A token count the compaction side reported in a header, as a number for the access line."""
    return int(header) if header is not None and header.isdigit() else None


def _added(total: int | None, value: Any) -> int | None:
    """`total` plus `value` when `value` is a token count (a non-negative int, not a bool); `total` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return total
    return (total or 0) + value
