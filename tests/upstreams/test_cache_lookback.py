"""The fake Messages API's prompt cache writes and reads only where Anthropic's prompt caching page says it does.

A cache entry is written for the prefix ending at each `cache_control` breakpoint (a prefix of 1,024 tokens or more),
and a request finds hits only at its own breakpoints and at the block boundaries up to 20 blocks before each
(`LOOKBACK_BLOCKS`); the tokens written beyond what was read are `cache_creation_input_tokens`, billed at the write
price. The proxy's breakpoint at the end of a compaction's kept head (`proxy.formats.anthropic.rules`) is measured
against this cache, so it must not find hits the API would not.
"""

from __future__ import annotations

from proxy.simulator.anthropic_rules import Segment
from proxy.simulator.anthropic_upstream import LOOKBACK_BLOCKS, PromptCache

HEAD = [Segment(b"system", 1500, breakpoint=False)]


def blocks(name: bytes, count: int, marked_last: bool = True) -> list[Segment]:
    """`count` blocks of 10 tokens, the last one a breakpoint when `marked_last`."""
    return [Segment(name + b"%d" % n, 10, marked_last and n == count - 1) for n in range(count)]


def test_a_prefix_no_breakpoint_ended_is_never_read() -> None:
    cache = PromptCache()
    cache.usage("m", [*HEAD, *blocks(b"a", 3)])
    later = cache.usage("m", [*HEAD, *blocks(b"b", 3)])
    assert later["cache_read_input_tokens"] == 0, "the unmarked head was read"
    assert later["cache_creation_input_tokens"] == 1530


def test_a_written_prefix_is_read_only_within_the_lookback_of_a_breakpoint() -> None:
    cache = PromptCache()
    written = cache.usage("m", [Segment(b"system", 1500, breakpoint=True), *blocks(b"a", 1, marked_last=False)])
    assert written["cache_creation_input_tokens"] == 1500
    near = cache.usage("m", [*HEAD, *blocks(b"near", LOOKBACK_BLOCKS - 1)])
    assert near["cache_read_input_tokens"] == 1500, "a breakpoint 19 blocks after the head reads it"
    assert near["cache_creation_input_tokens"] == 10 * (LOOKBACK_BLOCKS - 1), "only what follows is written"
    far = cache.usage("m", [*HEAD, *blocks(b"far", LOOKBACK_BLOCKS)])
    assert far["cache_read_input_tokens"] == 0, "a breakpoint 20 blocks after the head looked back to it"
    assert far["cache_creation_input_tokens"] == 1500 + 10 * LOOKBACK_BLOCKS
