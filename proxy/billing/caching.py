"""Each provider's prompt-cache rules, from its documentation, as the estimate of going direct applies them.

- OpenAI (Chat Completions, Responses): a prompt of 1024 tokens or more is cached by itself; a later prompt is
  served the longest prefix it shares with it, in increments of 128 tokens; writing costs nothing; an unused prefix
  is kept "5 to 10 minutes of inactivity, up to a maximum of one hour" (the estimate takes the 5 minutes promised).
- Anthropic (Messages): the prefix up to a `cache_control` breakpoint is written (at the cache-write price) and read
  back by a later prompt sharing it; a prefix under 1024 tokens is not cached (2048 for the Haiku models: the
  estimate takes 1024); the default lifetime is 5 minutes, refreshed each time the prefix is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from proxy.billing.prices import PROVIDERS


@dataclass(frozen=True)
class CacheRules:
    """What a provider's prompt cache serves of a prompt that repeats an earlier one's prefix.

    :param lifetime: Seconds a prefix stays cached after it was last used.
    :param minimum: The shortest prefix cached, in tokens.
    :param block: Cache hits come in multiples of this many tokens.
    :param writes: Whether the provider bills writing a prefix to its cache (and reports those tokens apart).
    """

    lifetime: float
    minimum: int
    block: int
    writes: bool

    def served(self, reused: int) -> int:
        """The tokens of a `reused`-token prefix that the cache serves."""
        served = reused - reused % self.block
        return served if served >= self.minimum else 0

    def written(self, prompt: int, served: int) -> int:
        """The tokens of a `prompt` written to the cache beyond the `served` prefix (0 where writes are free)."""
        return prompt - served if self.writes and prompt >= self.minimum else 0


RULES: Final[Mapping[str, CacheRules]] = {
    "openai": CacheRules(lifetime=300.0, minimum=1024, block=128, writes=False),
    "anthropic": CacheRules(lifetime=300.0, minimum=1024, block=1, writes=True),
}
"""The rules of each provider (`proxy.billing.prices.PROVIDERS` names them)."""


def rules_for(api: str) -> CacheRules:
    """The cache rules of the provider of `api`: OpenAI's for an API not known (the OpenAI-compatible servers')."""
    return RULES[PROVIDERS.get(api, "openai")]
