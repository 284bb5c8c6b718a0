"""The fake upstreams' prompt caches forget a prefix left unused past its lifetime, on the clock they are given."""

from __future__ import annotations

from proxy.simulator.anthropic_rules import Segment
from proxy.simulator.anthropic_upstream import CACHE_LIFETIME as ANTHROPIC_LIFETIME
from proxy.simulator.anthropic_upstream import PromptCache as AnthropicCache
from proxy.simulator.openai_tokens import CACHE_LIFETIME as OPENAI_LIFETIME
from proxy.simulator.openai_tokens import PromptCache as OpenAICache
from tests.support.fake_clock import FakeClock

PROMPT = list(range(3000))


def test_openai_forgets_a_prefix_unused_past_its_lifetime_and_each_use_renews_it() -> None:
    clock = FakeClock()
    cache = OpenAICache(clock=clock)
    assert cache.cached_tokens("m", PROMPT) == 0
    clock.advance(OPENAI_LIFETIME)
    assert cache.cached_tokens("m", PROMPT) == 2944  # used again within its lifetime: renewed
    clock.advance(OPENAI_LIFETIME)
    assert cache.cached_tokens("m", PROMPT) == 2944
    clock.advance(OPENAI_LIFETIME + 1)
    assert cache.cached_tokens("m", PROMPT) == 0


def test_anthropic_forgets_a_written_prefix_unread_past_its_lifetime_and_each_read_renews_it() -> None:
    clock = FakeClock()
    cache = AnthropicCache(clock=clock)
    segments = [Segment(b"rules", 1500, breakpoint=True), Segment(b"question", 20, breakpoint=False)]
    assert cache.usage("claude", segments)["cache_creation_input_tokens"] == 1500
    clock.advance(ANTHROPIC_LIFETIME)
    assert cache.usage("claude", segments)["cache_read_input_tokens"] == 1500
    clock.advance(ANTHROPIC_LIFETIME)
    assert cache.usage("claude", segments)["cache_read_input_tokens"] == 1500
    clock.advance(ANTHROPIC_LIFETIME + 1)
    expired = cache.usage("claude", segments)
    assert (expired["cache_read_input_tokens"], expired["cache_creation_input_tokens"]) == (0, 1500)
