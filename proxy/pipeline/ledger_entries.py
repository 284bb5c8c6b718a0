"""What the pipeline tells the ledger of each request: when it is planned, and when the provider's usage is known.

A planned request is opened in the ledger (`proxy.pipeline.ledger`) and its response headers say which conversation
it belongs to and the causes of cache misses that already apply (`X-Compaction-Cache-Misses: new,compaction`). When
its answer's usage arrives, the request is recorded and its misses attributed; the figures go to the metrics and, by
`ForwardPlan.cache_misses`, to the access log. The headers are sent before the answer is known, so they carry the
causes only; the tokens by cause are in the log line, the metrics and the dashboard's JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxy.config import Settings
from proxy.engine.messages import chain_keys, message_key
from proxy.names import shown
from proxy.pipeline.byte_bound import SIZED_BELOW_BYTES
from proxy.pipeline.cache_misses import Reported, lifetime
from proxy.pipeline.caller import Caller, conversation_of
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest
from proxy.pipeline.ledger import CONVERSATION_HEADER, INSTRUCTIONS, CompactionNote, Forwarded, Ledger
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.prepared import Prepared

MISSES_HEADER: Final = "X-Compaction-Cache-Misses"
"""Response header listing the causes of cache misses that apply to the request (see the module docstring)."""


def open_entry(
    ledger: Ledger, plan: ForwardPlan, incoming: IncomingRequest, settings: Settings, caller: Caller
) -> None:
    """Open the planned request in the ledger and say its conversation and expected causes in its headers.

    A request continuing a history its provider keeps is opened only when the client names its conversation: it
    carries only its new messages, which identify nothing.
    """
    exchange = plan.context
    if not isinstance(exchange, Prepared) or exchange.parsed is None:
        return
    named = conversation_of(incoming.headers, settings, incoming.wire)
    if exchange.provider_state and not named:
        return
    messages = exchange.request.messages
    chain = exchange.original
    if not chain and not exchange.provider_state and exchange.size < SIZED_BELOW_BYTES:
        # A request sized by its bytes was never hashed: hashing one that small is cheap.
        chain = chain_keys([message_key(message) for message in messages])
    opening = ledger.open(
        scope=caller.scope,
        named=named,
        client_chain=chain,
        opening_instructions=bool(messages) and messages[0].get("role") in INSTRUCTIONS,
        api=incoming.wire.name,
        model=shown(exchange.model),
        tenant=caller.tenant,
        lifetime=lifetime(incoming.wire.name, exchange.request.body),
    )
    exchange.opening = opening
    _announce(ledger, plan)


def retried_entry(ledger: Ledger, retry: ForwardPlan | None, first: Prepared) -> None:
    """A compacted retry after an overflow is the same request as its `first` try: it keeps its entry."""
    if retry is not None and isinstance(retry.context, Prepared):
        retry.context.opening = first.opening
        _announce(ledger, retry)


def _announce(ledger: Ledger, plan: ForwardPlan) -> None:
    """Say the opened request's conversation and expected causes in the headers of `plan`."""
    exchange = plan.context
    if not isinstance(exchange, Prepared) or exchange.opening is None:
        return
    plan.response_headers[CONVERSATION_HEADER] = exchange.opening.conversation
    plan.response_headers[MISSES_HEADER] = ",".join(ledger.expected(exchange.opening, _forwarded(plan, exchange)))


def close_entry(ledger: Ledger, metrics: CompactionMetrics, plan: ForwardPlan, usage: Mapping[str, Any] | None) -> None:
    """Record an answered request with its usage, attribute its misses, count them, and hand them to the log line."""
    exchange = plan.context
    reported = Reported.of(usage)
    if not isinstance(exchange, Prepared) or exchange.opening is None or reported is None:
        return
    headers = plan.response_headers
    before = _count(headers.get("X-Compaction-Tokens-Before"))
    after = _count(headers.get("X-Compaction-Tokens-After"))
    compaction = None
    if headers.get("X-Compaction", "").startswith("compacted") and before is not None and after is not None:
        strategies = tuple(name for name in headers.get("X-Compaction-Strategies", "").split(",") if name)
        compaction = CompactionNote(strategies, before, after)
    record = ledger.close(
        exchange.opening,
        _forwarded(plan, exchange),
        reported,
        window=exchange.window,
        client_tokens=before,
        forwarded_tokens=after if after is not None else before,
        compaction=compaction,
    )
    metrics.count_misses(record.api, record.misses)
    plan.cache_misses = record.misses.shown() or "none"


def _forwarded(plan: ForwardPlan, exchange: Prepared) -> Forwarded:
    """What was sent for `plan`: its messages' chain, and whether the proxy's read tool was offered with them."""
    return Forwarded(exchange.chain, tools_added=plan.reads is not None)


def _count(header: str | None) -> int | None:
    """A token count said in a response header, or None."""
    return int(header) if header is not None and header.isdigit() else None
