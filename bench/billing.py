"""What a provider bills for a long run: uncached input, cached input at its discount, and output.

Compaction keeps a conversation inside its window, but each compaction rewrites the prompt's beginning, so the
provider's prefix cache serves none of the next prompt: that prompt is billed at the full input price. This module
adds up the usage the upstream reported, request by request, into those three counts and prices them with OpenAI's
published ratios, so a run through the proxy can be set against the same agent going direct up to the turn where
the direct run overflowed.

Prices are in input-token equivalents (an uncached input token is 1), so a bill reads as "this many prompt tokens at
full price". OpenAI's published prices (USD per million tokens: input / cached input / output):

- gpt-4o-mini: 0.15 / 0.075 / 0.60, so cached input at 0.5x and output at 4x (the model the long run names);
- gpt-5: 1.25 / 0.125 / 10.00, so cached input at 0.1x and output at 8x (where a lost cache costs the most).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Usage = Mapping[str, Any]


@dataclass(frozen=True)
class Prices:
    """A model family's prices relative to its uncached input token.

    :param family: The model family the ratios are OpenAI's published prices of.
    :param cached: The price of a cached input token, as a fraction of an uncached one.
    :param output: The price of an output token, in uncached input tokens.
    """

    family: str
    cached: float
    output: float


PRICES = (Prices("gpt-4o-mini", cached=0.5, output=4.0), Prices("gpt-5", cached=0.1, output=8.0))


@dataclass(frozen=True)
class Bill:
    """The tokens a provider bills for some requests, by kind."""

    requests: int
    uncached_input: int
    cached_input: int
    output: int

    def billed(self, prices: Prices) -> float:
        """The bill in input-token equivalents at `prices`."""
        return self.uncached_input + prices.cached * self.cached_input + prices.output * self.output

    def as_dict(self) -> dict[str, Any]:
        """The counts, and the bill at each of `PRICES`, for the bench's JSON."""
        billed = {prices.family: round(self.billed(prices)) for prices in PRICES}
        return {
            "requests": self.requests,
            "uncached_input": self.uncached_input,
            "cached_input": self.cached_input,
            "output": self.output,
            "billed": billed,
        }


def bill(usages: Iterable[Usage]) -> Bill:
    """Add up chat-completion usages (`prompt_tokens`, `prompt_tokens_details.cached_tokens`, `completion_tokens`)."""
    requests = uncached = cached = output = 0
    for usage in usages:
        hits = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        requests += 1
        cached += hits
        uncached += int(usage["prompt_tokens"]) - hits
        output += int(usage["completion_tokens"])
    return Bill(requests, uncached, cached, output)


def first_turns(usages: Sequence[Usage], summaries: Sequence[bool], turns: int) -> list[Usage]:
    """The usages of a run's first `turns` client turns, with the summary calls made before the last of them.

    :param summaries: For each usage, whether it answered one of the proxy's summary calls (not a client turn).
    """
    kept: list[Usage] = []
    seen = 0
    for usage, summary in zip(usages, summaries, strict=True):
        if not summary:
            if seen == turns:
                break
            seen += 1
        kept.append(usage)
    return kept


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The markdown table of long runs' bills through the proxy against going direct, one line per run.

    Each row is a `bench.long_run.one_run` result carrying `billing` (`bench.long_run.compared`).
    """
    families = " / ".join(f"{price.family} (cached {price.cached:g}x, output {price.output:g}x)" for price in PRICES)
    lines = [
        f"Billed in input-token equivalents, {families}.",
        "",
        "| run | direct: turns until it overflowed | direct billed | proxy billed, same turns | proxy / direct "
        "| proxy, whole run: turns, compactions | uncached / cached / output | billed per turn |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        billing = row["billing"]
        direct, same, whole = billing["direct"], billing["proxy_same_turns"], billing["proxy"]
        until = f"{billing['direct_turns']}" if billing["direct_overflowed"] else f"{billing['direct_turns']} (never)"
        ratios = " / ".join(
            f"{same['billed'][prices.family] / direct['billed'][prices.family]:.2f}x" for prices in PRICES
        )
        per_turn = " / ".join(f"{whole['billed'][prices.family] / row['turns']:.0f}" for prices in PRICES)
        lines.append(
            f"| {row['label']} | {until} | {_both(direct)} | {_both(same)} | {ratios} "
            f"| {row['turns']}, {row['compacted_turns']} | {whole['uncached_input']} / {whole['cached_input']} "
            f"/ {whole['output']} | {per_turn} |"
        )
    return lines


def _both(figures: Mapping[str, Any]) -> str:
    return " / ".join(f"{figures['billed'][prices.family]}" for prices in PRICES)
