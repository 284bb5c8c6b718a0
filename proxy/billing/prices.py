"""A model's prices: the operator's `prices` setting first, then the price library, else unknown (never a guess).

The library is pydantic's `genai-prices` (the `billing` extra): its prices ship inside the package as Python data,
kept up to date by its maintainers from the providers' pages, with cache-read and cache-write prices and the
long-context tiers (Claude's and Gemini's prices above 200k input tokens). It is read from the installed package
only: the library can fetch newer prices over the network (`UpdatePrices`), and this module never asks it to.

A model is looked up at the provider whose API the request spoke (OpenAI's for Chat Completions and Responses,
Anthropic's for Messages), so a self-hosted `llama-3` behind an OpenAI-compatible server is not priced as some
cloud's `llama-3`: it is unknown, and billed in tokens only, until the operator's `prices` names it. Loading the
library's data takes a second or two of CPU, once, on the first model it is asked about.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import version
from typing import Any, Final, Protocol

LIBRARY: Final = "genai-prices"
"""The price library, as a priced bill names its source."""

PROVIDERS: Final[Mapping[str, str]] = {
    "chat_completions": "openai",
    "responses": "openai",
    "messages": "anthropic",
    "openai": "openai",
    "anthropic": "anthropic",
}
"""The library's provider of each API (a wire format's name, or a route's API)."""

MILLION: Final = Decimal(1_000_000)


class PerMillion(Protocol):
    """Prices in USD per million tokens, as the operator's `prices` setting holds them (`proxy.config.prices`)."""

    @property
    def input(self) -> float:
        """Uncached input."""
        ...

    @property
    def output(self) -> float:
        """Output."""
        ...

    @property
    def cached(self) -> float | None:
        """Input read from the cache; None: the input price."""
        ...

    @property
    def cache_write(self) -> float | None:
        """Input written to the cache; None: the input price."""
        ...


@dataclass(frozen=True)
class Rate:
    """One price in USD per million tokens, with the higher prices of a long prompt (the library's tiers).

    :param base: The price of a prompt up to the first tier.
    :param tiers: `(start, price)` in ascending order: `price` applies to a prompt of more than `start` input tokens.
    """

    base: Decimal
    tiers: tuple[tuple[int, Decimal], ...] = ()

    def at(self, prompt_tokens: int) -> Decimal:
        """The price for a request whose input (cached included) is `prompt_tokens` long."""
        price = self.base
        for start, tier in self.tiers:
            if prompt_tokens > start:
                price = tier
        return price


@dataclass(frozen=True)
class Rates:
    """A model's four prices, and where they come from (`prices['gpt-4o*']`, `genai-prices 0.2.3: openai gpt-5`)."""

    input: Rate
    cached: Rate
    cache_write: Rate
    output: Rate
    source: str

    def cost(self, prompt_tokens: int, uncached: int, cached: int, cache_write: int, output: int) -> Decimal:
        """USD for one request: each kind of token at its price for a prompt of `prompt_tokens`."""
        priced = (
            (self.input, uncached),
            (self.cached, cached),
            (self.cache_write, cache_write),
            (self.output, output),
        )
        return sum((rate.at(prompt_tokens) * tokens for rate, tokens in priced), Decimal(0)) / MILLION


class PriceBook:
    """Looks up a model's `Rates`: the operator's prices (exact name, then patterns in order), then the library.

    :param overrides: The `prices` setting: model name or shell-style pattern to prices per million tokens.
    :param library: Whether to look in the library: a book made while its data is still loading (`preload`) prices
        the operator's models only, so a bill never waits for it.
    """

    def __init__(self, overrides: Mapping[str, PerMillion] | None = None, *, library: bool = True) -> None:
        self.overrides = dict(overrides or {})
        self.library = library

    def rates(self, model: str | None, api: str) -> Rates | None:
        """The prices of `model` at the provider of `api`; None when neither the setting nor the library knows them."""
        if not model:
            return None
        exact = model if model in self.overrides else None
        name = exact or next((key for key in self.overrides if fnmatch.fnmatchcase(model, key)), None)
        if name is not None:
            return _from_setting(name, self.overrides[name])
        provider = PROVIDERS.get(api)
        return _from_library(model, provider) if provider and self.library else None


def _flat(price: float) -> Rate:
    return Rate(Decimal(str(price)))


def _from_setting(name: str, prices: PerMillion) -> Rates:
    """The operator's prices: an unset cache price is the input price."""
    cached = prices.input if prices.cached is None else prices.cached
    write = prices.input if prices.cache_write is None else prices.cache_write
    return Rates(_flat(prices.input), _flat(cached), _flat(write), _flat(prices.output), f"prices[{name!r}]")


def preload() -> bool:
    """Load the library's prices now, so the first bill does not pay for it: call it off the event loop at start-up.

    :returns: Whether the library is installed.
    """
    return _library() is not None


@functools.cache
def _library() -> Any:
    """The library's prices as shipped in the installed package (a second or two of CPU, once); None without it."""
    try:
        from genai_prices import data_snapshot
    except ImportError:
        return None
    return data_snapshot.get_snapshot()


@functools.lru_cache(maxsize=1024)
def _from_library(model: str, provider: str) -> Rates | None:
    """The library's prices in force now for `model` at `provider`; None when it lacks them (or is not installed)."""
    library = _library()
    if library is None:
        return None
    try:
        found, info = library.find_provider_model(model, None, provider, None)
    except LookupError:
        return None
    prices = info.get_prices(datetime.now(tz=UTC))
    input_rate, output_rate = _rate(prices.input_mtok), _rate(prices.output_mtok)
    if input_rate is None or output_rate is None:
        return None
    return Rates(
        input_rate,
        _rate(prices.cache_read_mtok) or input_rate,
        _rate(prices.cache_write_mtok) or input_rate,
        output_rate,
        f"{LIBRARY} {version(LIBRARY)}: {found.id} {info.id}",
    )


def _rate(price: Any) -> Rate | None:
    """A library price (a Decimal, or tiered prices with `base` and `tiers` of `start` and `price`) as a `Rate`."""
    if price is None:
        return None
    if isinstance(price, Decimal):
        return Rate(price)
    tiers: Sequence[Any] = price.tiers
    return Rate(price.base, tuple(sorted((int(tier.start), tier.price) for tier in tiers)))
