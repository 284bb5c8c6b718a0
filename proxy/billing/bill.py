"""The bill of a conversation: what the provider billed through the proxy, against an estimate of going direct.

**Through the proxy** is read from the usage the provider reported for each forwarded request, the proxy's own calls
(summaries) included: its uncached input, its cached input (read from the provider's prompt cache), its cache writes
(Anthropic bills them apart) and its output, each at the model's price (`proxy.billing.prices`: the operator's
`prices`, else the price library, else unknown).

**Going direct** is an estimate of the same client requests sent straight to the provider as the client sent them:

- each request's input is the client's own request (`client_tokens`), and its output the output it got;
- the prefix it shares with the client's previous request (`client_reused_tokens`) is served from the cache when
  that request was sent within the provider's cache lifetime, as much of it as the provider's rules serve (OpenAI:
  from 1024 tokens, in 128-token steps; Anthropic: from 1024 tokens; `proxy.billing.caching`); the rest is uncached,
  and written to the cache where the provider bills writes (Anthropic, assuming the client marks its prompt for
  caching, as agents do);
- it stops at the first request larger than the model's window: going direct, the provider would have refused it,
  and every request after it. The estimate then covers the requests before it, and so does the proxy's bill set
  against it (`covered`); `stopped` says so.

Limits: the estimate takes the client's prefix reuse to be what the provider's cache serves of it, so a provider
that evicts early (under load, or OpenAI past its 5 minutes) would bill more going direct, and one keeping prefixes
longer (an hour at off-peak, or Anthropic's one-hour cache) less; it assumes the same answers (a model answering
a longer prompt differently would change the requests after it); Anthropic's larger minimum for the Haiku models
(2048 tokens) is not applied, nor its lookback (a request adding 20 blocks or more after the client's previous
breakpoint reads nothing there); and requests are taken in the order given, each one's previous request being the
client request before it. Prices are the ones in force now, not at the time of each request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any, Final, Protocol

from proxy.billing.caching import rules_for
from proxy.billing.prices import PriceBook, Rates


class Request(Protocol):
    """A forwarded request as the conversation's ledger records it (the attributes the bill reads).

    `prompt_tokens` is the provider's whole input count, its cached and cache-write tokens included. A request the
    proxy made on its own (a summary call) has `client_tokens` 0: it is billed through the proxy, and has no
    counterpart going direct.
    """

    @property
    def at(self) -> float:
        """When it was sent, in seconds."""
        ...

    @property
    def api(self) -> str:
        """The wire format it spoke (`chat_completions`, `responses`, `messages`)."""
        ...

    @property
    def model(self) -> str | None:
        """The model it named."""
        ...

    @property
    def window(self) -> int | None:
        """The model's context window in tokens (0 or None: unknown)."""
        ...

    @property
    def client_tokens(self) -> int | None:
        """Its input as the client sent it, in tokens (0 or None: a call the proxy made on its own, or not known)."""
        ...

    @property
    def client_reused_tokens(self) -> int:
        """The tokens of the client's request equal to the prefix of the client's previous one."""
        ...

    @property
    def prompt_tokens(self) -> int:
        """The input the provider reported, its cached and cache-write tokens included."""
        ...

    @property
    def cached_tokens(self) -> int:
        """The input the provider reported as read from its cache."""
        ...

    @property
    def cache_write_tokens(self) -> int:
        """The input the provider reported as written to its cache."""
        ...

    @property
    def output_tokens(self) -> int:
        """The output the provider reported."""
        ...


@dataclass(frozen=True)
class Charge:
    """Requests billed, their tokens by kind, and their price.

    :param usd: The price of the priced requests, in USD.
    :param unpriced: The requests of a model whose price is unknown: billed in tokens only, never at a guessed price.
    """

    requests: int = 0
    uncached: int = 0
    cached: int = 0
    cache_write: int = 0
    output: int = 0
    usd: Decimal = Decimal(0)
    unpriced: int = 0

    def __add__(self, other: Charge) -> Charge:
        return Charge(*(getattr(self, field.name) + getattr(other, field.name) for field in fields(self)))

    @property
    def input(self) -> int:
        """Every input token: uncached, cached and written to the cache."""
        return self.uncached + self.cached + self.cache_write

    @property
    def price(self) -> str:
        """`known` (every request priced), `partial`, or `unknown` (tokens only)."""
        if not self.unpriced:
            return "known"
        return "unknown" if self.unpriced == self.requests else "partial"

    def as_dict(self) -> dict[str, Any]:
        """The charge for JSON: `usd` is null when no request could be priced, and covers the priced ones else."""
        return {
            "requests": self.requests,
            "uncached_input": self.uncached,
            "cached_input": self.cached,
            "cache_write_input": self.cache_write,
            "output": self.output,
            "usd": None if self.price == "unknown" else float(self.usd),
            "price": self.price,
            "unpriced_requests": self.unpriced,
        }


Tokens = tuple[int, int, int, int]
"""A request's tokens by how they are billed, in `KINDS` order."""

KINDS: Final = ("uncached", "cached", "cache_write", "output")
"""The kinds of billed tokens: input by how it is billed (not cached, read from the cache, written to it), output."""


def billed(prompt: int, cached: int, cache_write: int, output: int) -> Tokens:
    """Tokens by kind of `prompt` input tokens, `cached` of them read from the cache and `cache_write` written."""
    return max(prompt - cached - cache_write, 0), cached, cache_write, output


def charge(rates: Rates | None, prompt: int, cached: int, cache_write: int, output: int) -> Charge:
    """One request's charge: `prompt` input tokens, `cached` of them read from the cache, `cache_write` written."""
    kinds = billed(prompt, cached, cache_write, output)
    if rates is None:
        return Charge(1, *kinds, unpriced=1)
    return Charge(1, *kinds, usd=rates.cost(prompt, *kinds))


@dataclass(frozen=True)
class Bill:
    """Conversations' bill through the proxy, and the estimate of going direct (see the module's docstring).

    :param proxy: Every request forwarded, the proxy's own calls included.
    :param covered: The requests the estimate covers (all of them, unless it stopped), through the proxy.
    :param direct: Those requests' estimate going direct: the client's requests among them, as the client sent them.
    :param client_requests: The client's requests (the proxy's own calls left out), covered or not.
    :param conversations: How many conversations the bill adds up.
    :param stopped: How many of them the estimate stops short in (a request the window could not have held).
    """

    proxy: Charge = Charge()
    covered: Charge = Charge()
    direct: Charge = Charge()
    client_requests: int = 0
    conversations: int = 0
    stopped: int = 0

    def __add__(self, other: Bill) -> Bill:
        return Bill(*(getattr(self, field.name) + getattr(other, field.name) for field in fields(self)))

    def as_dict(self) -> dict[str, Any]:
        """The bill for JSON."""
        return {
            "proxy": self.proxy.as_dict(),
            "covered": self.covered.as_dict(),
            "direct": self.direct.as_dict(),
            "client_requests": self.client_requests,
            "conversations": self.conversations,
            "stopped": self.stopped,
        }


def conversation_bill(requests: Sequence[Request], prices: PriceBook) -> Bill:
    """The bill of one conversation's requests, in the order they were sent."""
    stop = refused_at(requests)
    rates = [prices.rates(request.model, request.api) for request in requests]
    forwarded = [
        charge(price, request.prompt_tokens, request.cached_tokens, request.cache_write_tokens, request.output_tokens)
        for request, price in zip(requests, rates, strict=True)
    ]
    covered = len(requests) if stop is None else stop
    direct, previous = Charge(), None
    for request, price in zip(requests[:covered], rates, strict=False):
        if request.client_tokens:
            direct += direct_charge(request, price, previous)
            previous = request.at
    clients = sum(bool(request.client_tokens) for request in requests)
    proxy, through = sum(forwarded, Charge()), sum(forwarded[:covered], Charge())
    return Bill(proxy, through, direct, clients, conversations=1, stopped=int(stop is not None))


def refused_at(requests: Sequence[Request]) -> int | None:
    """Where going direct stops: the index of the first request larger than its window (None: it never does)."""
    return next(
        (index for index, request in enumerate(requests) if 0 < (request.window or 0) < (request.client_tokens or 0)),
        None,
    )


def direct_charge(request: Request, rates: Rates | None, previous: float | None) -> Charge:
    """The estimate of one client request sent direct, the client's previous one sent at `previous` (None: none)."""
    return charge(rates, *_direct_input(request, previous), request.output_tokens)


def _direct_input(request: Request, previous: float | None) -> tuple[int, int, int]:
    """A client request's input sent direct: all of it, what the cache serves of it, and what is written to it."""
    rules = rules_for(request.api)
    alive = previous is not None and request.at - previous <= rules.lifetime
    client = request.client_tokens or 0
    served = rules.served(min(request.client_reused_tokens, client)) if alive else 0
    return client, served, rules.written(client, served)


def tokens(request: Request, previous: float | None) -> tuple[Tokens, Tokens | None]:
    """One request's tokens by kind (no price), through the proxy and going direct: what the metrics count.

    Going direct is None for a call the proxy made on its own, and for a request larger than its window (the
    provider would have refused it). The client's previous request was sent at `previous` (None: none).
    """
    proxy = billed(request.prompt_tokens, request.cached_tokens, request.cache_write_tokens, request.output_tokens)
    client = request.client_tokens or 0
    if client <= 0 or 0 < (request.window or 0) < client:
        return proxy, None
    return proxy, billed(*_direct_input(request, previous), request.output_tokens)


def total(bills: Iterable[Bill]) -> Bill:
    """Conversations' bills added up."""
    return sum(bills, Bill())
