"""Why the provider did not serve a request's prompt from its cache: every uncached prompt token given one cause.

The provider reports, for each answer, the prompt tokens it read (`prompt`) and how many of them it served from its
prompt cache (`cached`). The others, `prompt - cached`, are split into causes that add up to them exactly. The
amounts always come from the provider's own figures; what the proxy knows of the conversation (the hash chains of
the messages the client sent and of those the proxy forwarded, the time since the previous request, its own token
estimates) only decides which cause the figures go to. Causes are assigned in this order, each taking what it
explains of what the earlier ones left:

1. `first`: the conversation's first request the proxy saw. Nothing of it could have been cached by an earlier
   request of the conversation; all its uncached tokens are `first`.
2. `new`: the request's new messages (the previous answer re-sent and what the client added), which no cache holds
   yet: the provider's own count of the growth, `prompt - previous prompt`, unless the proxy rewrote this request
   or the previous one and the forwarded prefix broke (a compaction shrinks the prompt), when it is the growth of
   the client's request (`client_tokens - previous client_tokens`; see `proxy.pipeline.ledger.client_size`). What
   is left is the part of the request the previous one already sent (`rest`).
3. `expiry`: more time passed since the conversation's previous request than the provider keeps a prefix
   (`lifetime`): all the rest, whoever changed what, since even an unchanged prefix would have missed.
4. The forwarded prefix intact: the proxy sent the provider what it had sent before plus new messages (and the same
   tools: adding its read tool changes what every provider caches first), so the rest
   is the provider's own miss, `provider` (a cache evicted early, a request routed to another machine).
5. `client`: the client's own prefix changed (its request does not extend its previous one): what a direct run
   would have missed too, the tokens of the previous request the client no longer repeats
   (`previous client_tokens - client_reused_tokens`), at most the rest.
6. `compaction`: the proxy rewrote this request or the previous one (its forwarded prefix differs from what the
   client sent): what the client's change does not explain of the rest is the proxy's. This is the one cause the
   proxy is responsible for.
7. `provider`: whatever is still left.

Expiry comes before the proxy's and the client's causes because it makes them moot: a direct run would have missed
the same tokens. The client's cause comes before compaction's so that the proxy is never charged for a miss the
client caused, and `provider` is last, the remainder no rule explains. A request whose forwarded prefix is intact is
never charged to the client or the proxy, whatever changed in what the client sent (an edit inside a compacted
prefix the rewrite memory replays unchanged does not reach the provider).

Cache lifetimes, from the providers' documentation: OpenAI keeps a cached prefix for 5 to 10 minutes of inactivity
(at most an hour), 24 hours when a request asks for `prompt_cache_retention: "24h"`; Anthropic 5 minutes by default,
an hour for a breakpoint marked `"ttl": "1h"`, each refreshed whenever the prefix is read. The shorter documented
figure is taken, so a miss after a pause the provider may already have forgotten is `expiry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

CAUSES: Final = ("new", "first", "expiry", "client", "compaction", "provider")
"""Every cause, in the order the header and the log name them."""

PROXY_CAUSES: Final = ("compaction",)
"""The causes the proxy is responsible for (`compaction_proxy_proxy_cache_miss_tokens_total`)."""

DEFAULT_LIFETIME: Final = 5 * 60.0
"""Seconds a provider keeps an unused prefix when nothing longer is asked: Anthropic's default `ttl` (5 minutes) and
the short end of OpenAI's "5 to 10 minutes of inactivity"."""

EXTENDED_LIFETIMES: Final = {"messages": 60 * 60.0, "chat_completions": 24 * 60 * 60.0, "responses": 24 * 60 * 60.0}
"""Seconds a prefix is kept when the request asks for longer, by API: Anthropic's `"ttl": "1h"`, OpenAI's
`prompt_cache_retention: "24h"`."""


def lifetime(api: str, body: Mapping[str, Any]) -> float:
    """How long the provider keeps this request's prefix, in seconds: longer when the request (parsed) asks for it.

    OpenAI's `prompt_cache_retention: "24h"` is a top-level field. An Anthropic breakpoint marked `"ttl": "1h"` is
    looked for in the system prompt and the tools only, which the API caches first: a longer-lived breakpoint must
    precede every shorter one, so a conversation cached for an hour marks them so too. The messages are not walked,
    which would cost a pass over the whole request.
    """
    extended = EXTENDED_LIFETIMES.get(api)
    if extended is None:
        return DEFAULT_LIFETIME
    if api != "messages":
        return extended if body.get("prompt_cache_retention") == "24h" else DEFAULT_LIFETIME
    system, tools = body.get("system"), body.get("tools")
    marked = [*(system if isinstance(system, list) else ()), *(tools if isinstance(tools, list) else ())]
    return extended if any(_long_lived(block) for block in marked) else DEFAULT_LIFETIME


def _long_lived(block: Any) -> bool:
    """Whether a system block or a tool is a breakpoint marked to live an hour."""
    control = block.get("cache_control") if isinstance(block, Mapping) else None
    return isinstance(control, Mapping) and control.get("ttl") == "1h"


@dataclass(slots=True)
class Reported:
    """The provider's usage of one answer, the same across the three formats.

    :param prompt_tokens: Every prompt token the model read (Anthropic: `input_tokens + cache_read_input_tokens +
        cache_creation_input_tokens`).
    :param cached_tokens: Of those, the ones served from the prompt cache (at most `prompt_tokens`).
    :param cache_write_tokens: Of those, the ones written to the cache (Anthropic's `cache_creation_input_tokens`;
        OpenAI reports none).
    :param output_tokens: The answer's tokens.
    """

    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, usage: Mapping[str, Any] | None) -> Reported | None:
        """The usage the pipeline is handed (chat-completion field names, see `UpstreamOutcome.usage`), or None."""
        prompt = _tokens(usage.get("prompt_tokens")) if usage else None
        if usage is None or prompt is None:
            return None
        details = usage.get("prompt_tokens_details")
        # A dict is checked first: what every format hands over; `isinstance(x, Mapping)` costs an ABC's check.
        details = details if isinstance(details, (dict, Mapping)) else {}
        cached = min(prompt, _tokens(details.get("cached_tokens")) or 0)
        written = min(prompt - cached, _tokens(details.get("cache_write_tokens")) or 0)
        return cls(prompt, cached, written, _tokens(usage.get("completion_tokens")) or 0)

    @property
    def uncached(self) -> int:
        """The prompt tokens not served from the cache: what the causes split."""
        return self.prompt_tokens - self.cached_tokens


@dataclass(slots=True)
class ChainEnd:
    """Where a conversation's hash chain ends: enough to tell whether a later chain extends it, and no content.

    Element i of a chain identifies messages 0..i as a whole, so a chain extends this one exactly when its element
    at `length - 1` is `last`. A longer chain that extends it up to the element before (`before`) continues it too:
    a client that marks its newest message for the cache (Claude Code moves its breakpoint every turn) re-sends that
    message changed by the mark alone, which no prompt cache reads.
    """

    length: int
    last: bytes
    before: bytes = b""

    @classmethod
    def of(cls, chain: Sequence[bytes]) -> ChainEnd:
        """The end of `chain`."""
        return cls(len(chain), chain[-1] if chain else b"", chain[-2] if len(chain) > 1 else b"")

    def continued_by(self, chain: Sequence[bytes]) -> bool:
        """Whether `chain` starts with the chain this is the end of (its last message re-sent changed, when longer)."""
        if self.length == 0 or (len(chain) >= self.length and chain[self.length - 1] == self.last):
            return True
        return self.length > 1 and len(chain) > self.length and chain[self.length - 2] == self.before


@dataclass(slots=True)
class Sighting:
    """What a forwarded request leaves for the next one of its conversation to be compared with (no content).

    :param at: When it arrived (the ledger's clock, seconds).
    :param client: The end of the chain of the messages the client sent.
    :param forwarded: The end of the chain of the messages the proxy forwarded.
    :param client_tokens: The client's request's size, when known (`proxy.pipeline.ledger.client_size`).
    :param prompt_tokens: The prompt tokens the provider reported for it.
    :param tools_added: The proxy offered its read tool: the tools, which every cache puts before the messages,
        were not the client's.
    """

    at: float
    client: ChainEnd
    forwarded: ChainEnd
    client_tokens: int | None
    prompt_tokens: int
    tools_added: bool = False

    @property
    def rewritten(self) -> bool:
        """Whether the proxy forwarded something else than the client's request (its messages or its tools)."""
        # Forwarded as sent, the two ends are one object (`Ledger`): no fields to compare.
        return self.tools_added or (self.client is not self.forwarded and self.client != self.forwarded)


@dataclass(slots=True)
class Step:
    """How a request follows the previous one of its conversation: what decides its causes.

    :param gap: Seconds since the previous request arrived.
    :param forwarded_intact: What the proxy forwards extends what it forwarded for the previous request (the same
        tools, and messages that extend the previous ones).
    :param client_intact: What the client sent extends what it sent in the previous request.
    :param rewritten: The proxy forwarded something else than the client's messages, this time or the previous one.
    :param reported_growth: The provider's prompt tokens less the previous request's.
    :param client_growth: The proxy's estimate of the client's request less the previous one's, when it made both.
    :param client_lost: The tokens of the client's previous request its new one no longer repeats (estimated).
    """

    gap: float
    forwarded_intact: bool
    client_intact: bool
    rewritten: bool
    reported_growth: int
    client_growth: int | None
    client_lost: int

    @classmethod
    def between(
        cls,
        previous: Sighting,
        now: Sighting,
        chains: tuple[Sequence[bytes], Sequence[bytes]],
        client_reused: int,
    ) -> Step:
        """How `now` follows `previous`.

        :param chains: The chains of what the client sent and of what the proxy forwarded, in full.
        :param client_reused: The tokens the client's request shares with its previous one (estimated).
        """
        client_chain, forwarded_chain = chains
        growth = None
        if now.client_tokens is not None and previous.client_tokens is not None:
            growth = now.client_tokens - previous.client_tokens
        return cls(
            gap=now.at - previous.at,
            forwarded_intact=(
                previous.forwarded.continued_by(forwarded_chain) and previous.tools_added == now.tools_added
            ),
            client_intact=previous.client.continued_by(client_chain),
            rewritten=now.rewritten or previous.rewritten,
            reported_growth=now.prompt_tokens - previous.prompt_tokens,
            client_growth=growth,
            client_lost=max(0, (previous.client_tokens or 0) - client_reused),
        )


@dataclass(frozen=True, slots=True)
class Misses:
    """A request's uncached prompt tokens by cause (see the module docstring); they add up to `prompt - cached`."""

    new: int = 0
    first: int = 0
    expiry: int = 0
    client: int = 0
    compaction: int = 0
    provider: int = 0

    @property
    def total(self) -> int:
        """All the uncached prompt tokens."""
        return self.new + self.first + self.expiry + self.client + self.compaction + self.provider

    def as_dict(self) -> dict[str, int]:
        """Every cause and its tokens, in `CAUSES` order (spelled out: `fields()` costs more than the rest)."""
        return {
            "new": self.new,
            "first": self.first,
            "expiry": self.expiry,
            "client": self.client,
            "compaction": self.compaction,
            "provider": self.provider,
        }

    def shown(self) -> str:
        """The causes with tokens, as `cause=tokens` pairs (`new=300,compaction=1200`); empty when none missed."""
        return ",".join(f"{cause}={tokens}" for cause, tokens in self.as_dict().items() if tokens)


def expected(step: Step | None, lifetime: float) -> tuple[str, ...]:
    """The causes that apply to a request before its answer says how many tokens missed (see `attribute`)."""
    if step is None:
        return ("first",)
    if step.gap > lifetime:
        return ("new", "expiry")
    if step.forwarded_intact:
        return ("new",)
    if not step.client_intact:
        return ("new", "client")
    return ("new", "compaction") if step.rewritten else ("new",)


def attribute(reported: Reported, step: Step | None, lifetime: float) -> Misses:
    """Split the request's uncached prompt tokens by cause, by the rules of the module docstring.

    :param step: How the request follows the conversation's previous one; None for its first.
    :param lifetime: How long the provider keeps a prefix, in seconds (`lifetime`).
    """
    uncached = reported.uncached
    if step is None:
        return Misses(first=uncached)
    grown = step.reported_growth
    if not step.forwarded_intact and step.rewritten and step.client_growth is not None:
        grown = step.client_growth
    new = _within(grown, uncached)
    rest = uncached - new
    if step.gap > lifetime:
        return Misses(new=new, expiry=rest)
    if step.forwarded_intact:
        return Misses(new=new, provider=rest)
    client = 0 if step.client_intact else _within(step.client_lost, rest)
    compaction = rest - client if step.rewritten else 0
    return Misses(new=new, client=client, compaction=compaction, provider=rest - client - compaction)


def _within(value: int, bound: int) -> int:
    """`value` clamped to `0..bound`."""
    return max(0, min(value, bound))


def _tokens(value: Any) -> int | None:
    """`value` when it is a token count (a non-negative int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
