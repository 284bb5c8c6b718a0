"""What the pipeline tells the ledger of each request: when it is planned, and when the provider's usage is known.

A planned request is opened in the ledger (`proxy.pipeline.ledger`) and its response headers say which conversation
it belongs to and the causes of cache misses that already apply (`X-Compaction-Cache-Misses: new,compaction`). When
its answer's usage arrives, the request is recorded and its misses attributed; the figures go to the metrics and, by
`ForwardPlan.cache_misses`, to the access log. The headers are sent before the answer is known, so they carry the
causes only; the tokens by cause are in the log line, the metrics and the dashboard's JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from xxhash import xxh3_128_digest

from proxy.billing.bill import tokens
from proxy.engine.messages import Message, MessageKey, chain_keys, message_key
from proxy.names import shown
from proxy.pipeline.byte_bound import SIZED_BELOW_BYTES
from proxy.pipeline.cache_misses import Reported, lifetime
from proxy.pipeline.caller import Caller
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest
from proxy.pipeline.ledger import CONVERSATION_HEADER, CompactionNote, Forwarded, Ledger
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.prepared import Prepared

MISSES_HEADER: Final = "X-Compaction-Cache-Misses"
"""Response header listing the causes of cache misses that apply to the request (see the module docstring)."""

INSTRUCTIONS: Final = frozenset({"system", "developer"})
"""The roles of a conversation's opening instructions: with the first user message, they identify it."""

BESIDE_MESSAGES: Final = ("system", "instructions")
"""Request fields holding instructions beside the messages (the Messages API's, the Responses API's): part of the
opening."""


def open_entry(ledger: Ledger, plan: ForwardPlan, incoming: IncomingRequest, caller: Caller) -> None:
    """Open the planned request in the ledger and say its conversation and expected causes in its headers.

    A request continuing a history its provider keeps is opened only when the client names its conversation: it
    carries only its new messages, which identify nothing.
    """
    exchange = plan.context
    if not isinstance(exchange, Prepared) or exchange.parsed is None:
        return
    named = plan.conversation
    if exchange.provider_state and not named:
        return
    request = exchange.request
    chain = exchange.original
    keys: list[MessageKey] = []
    if not chain and not exchange.provider_state and exchange.size < SIZED_BELOW_BYTES:
        # A request sized by its bytes was never hashed: hashing one that small is cheap.
        keys = [message_key(message) for message in request.messages]
        chain = chain_keys(keys)
    # A conversation the client names is found by its name: its opening is not needed.
    unnamed = not named and not exchange.provider_state
    opening = ledger.open(
        scope=caller.scope,
        named=named,
        opening=opening_digest(request.messages, request.body, keys) if unnamed else None,
        client_chain=chain,
        api=incoming.wire.name,
        model=shown(exchange.model),
        tenant=caller.tenant,
        lifetime=lifetime(incoming.wire.name, request.body),
    )
    exchange.opening = opening
    _announce(ledger, plan)


def opening_digest(messages: list[Message], body: Mapping[str, Any], known: Sequence[MessageKey] = ()) -> bytes | None:
    """What identifies a conversation that names none: its opening, which every later request re-sends.

    Its instructions (a leading system or developer message, or a field beside the messages) and its first message
    otherwise, without their cache marks: a client that marks its newest message for the cache (Claude Code, every
    turn) sends the first message marked in the first request only. A single text block reads as its text. None
    without messages.

    :param known: The messages' keys when the caller has them (`message_key`, in order): a message whose content is
        text or null has no marks, so its key is the one known.
    """
    if not messages:
        return None
    role = messages[0].get("role")
    count = 2 if isinstance(role, str) and role in INSTRUCTIONS else 1
    keys = [
        _opening_key(message, known[index] if index < len(known) else None)
        for index, message in enumerate(messages[:count])
    ]
    # The parsed JSON's repr: any value it holds is written (orjson refuses integers past 64 bits).
    beside = [repr(_unmarked(body.get(name))).encode() for name in BESIDE_MESSAGES if body.get(name) is not None]
    return xxh3_128_digest(b"".join(keys + beside))


def _opening_key(message: Message, known: MessageKey | None) -> MessageKey:
    """The key of an opening message without its cache marks: `known`, its key, when it has none to take off."""
    content = message.get("content")
    if known is not None and (content is None or isinstance(content, str)):
        return known
    return message_key({**message, "content": _unmarked(content)})


def _unmarked(content: Any) -> Any:
    """Content without its blocks' `cache_control` marks; a lone text block as its text."""
    if not isinstance(content, list):
        return content
    blocks = [
        {key: value for key, value in block.items() if key != "cache_control"} if isinstance(block, Mapping) else block
        for block in content
    ]
    lone = blocks[0] if len(blocks) == 1 and isinstance(blocks[0], Mapping) else None
    return lone["text"] if lone is not None and lone.get("type") == "text" and set(lone) == {"type", "text"} else blocks


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
    previous_at = ledger.previous_at(exchange.opening)
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
    metrics.count_bill(record.api, *tokens(record, previous_at))
    plan.cache_misses = record.misses


def _forwarded(plan: ForwardPlan, exchange: Prepared) -> Forwarded:
    """What was sent for `plan`: its messages' chain, and whether the proxy's read tool was offered with them."""
    return Forwarded(exchange.chain, tools_added=plan.reads is not None)


def _count(header: str | None) -> int | None:
    """A token count said in a response header, or None."""
    return int(header) if header is not None and header.isdigit() else None
