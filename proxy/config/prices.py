"""Prices: the operator's own per-model prices, over the price library's (`proxy.billing.prices`).

A model the price library does not know (a self-hosted model behind an OpenAI-compatible server, a fine-tune, a
provider's newest release) is billed in tokens only until `prices` names it; a model the library knows is priced by
the operator's entry instead where one matches (a negotiated discount, a reseller's prices). Keys are model names or
shell-style patterns (`gpt-4o*`, `llama-*`): an exact name wins, then the first pattern that matches, in the order
given.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ModelPrices(BaseModel):
    """A model's prices in USD per million tokens.

    An unset `cached` or `cache_write` is the input price: a provider without a cache discount (or without a charge
    for cache writes, whose usage then reports none) bills those tokens as input.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, description="USD per million uncached input tokens.")
    output: float = Field(ge=0, description="USD per million output tokens.")
    cached: float | None = Field(default=None, ge=0, description="USD per million input tokens read from the cache.")
    cache_write: float | None = Field(default=None, ge=0, description="USD per million input tokens written to it.")


class PriceSettings(BaseModel):
    """The operator's prices, by model name or pattern."""

    prices: dict[str, ModelPrices] = Field(
        default_factory=dict,
        description=(
            "Per-model prices in USD per million tokens, over the price library's (genai-prices) and for models it"
            " does not know (those are billed in tokens only): `{model name or pattern: {input, cached, cache_write,"
            " output}}`; an exact name wins, then the first matching pattern. From the environment or a flag:"
            " `MODEL=input:N;cached:N;cache_write:N;output:N`, several comma-separated, or a JSON object."
        ),
    )

    @field_validator("prices")
    @classmethod
    def _check_names(cls, value: dict[str, ModelPrices]) -> dict[str, ModelPrices]:
        if any(not name.strip() for name in value):
            raise ValueError("a model name or pattern must not be empty")
        return value


def parse_prices(text: str) -> dict[str, dict[str, str]]:
    """`MODEL=input:N;cached:N;...`, comma-separated, as the mapping the settings validate.

    :raises ValueError: Saying which entry is malformed and how it should read.
    """
    prices: dict[str, dict[str, str]] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        model, sign, spec = entry.partition("=")
        pairs = [pair.partition(":") for pair in spec.split(";") if pair.strip()]
        if not sign or not model.strip() or not pairs or any(not colon for _, colon, _ in pairs):
            raise ValueError(f"expected MODEL=input:N;cached:N;cache_write:N;output:N, got {entry!r}")
        prices[model.strip()] = {kind.strip(): number.strip() for kind, _, number in pairs}
    return prices
