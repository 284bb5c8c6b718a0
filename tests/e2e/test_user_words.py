"""The user's own words reach the upstream through the real proxy's default chain, in every wire format.

A conversation whose user messages state requirements (short, each with a code to quote) and whose tool results and
answers fill the window goes through the proxy with its default settings (offloading on). Every user message, within
the budget the user text may take, reaches the upstream byte for byte; the next turns replay the rewrite, so the
prefix the upstream saw stays byte-identical, and a later compaction keeps the requirements again with one note.
Requirements too long to keep are offloaded behind references the model reads back in full, with the read tool's
tokens within the compaction target.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import Settings
from proxy.engine import Thresholds
from proxy.engine.strategies.offload import content_reference
from proxy.formats.anthropic.rules import MAX_BREAKPOINTS
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.examples import examples
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import PARAGRAPH, FormatCase, Upstream, by_format

WINDOW = 6000
NOTE = b"Earlier assistant and tool messages were removed"
"""Words of the user message window's omission note."""


def requirement(turn: int) -> str:
    return f"Requirement {turn}: the report quotes code R-{turn:02d} in section {turn}."


def with_requirements(entries: list[Any], first: int = 0) -> list[Any]:
    """The conversation's questions (`Question N: ...` user entries, in every format) turned into requirements."""
    turned: list[Any] = []
    for entry in entries:
        content = entry.get("content") if isinstance(entry, dict) else None
        if entry.get("role") == "user" and isinstance(content, str) and content.startswith("Question "):
            number = first + len([earlier for earlier in turned if _is_requirement(earlier)])
            turned.append({**entry, "content": requirement(number)})
        else:
            turned.append(entry)
    return turned


def _is_requirement(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("content"), str) and entry["content"].startswith("Req")


def requirements_in(forwarded: list[Any]) -> list[Any]:
    """The requirements among forwarded entries, a user text the proxy marked for the cache read as its text.

    On the Messages API the proxy's cache breakpoint at the end of the head it kept (`proxy.formats.anthropic.rules`)
    turns a user's text into one text block carrying `cache_control`: the same words, which the model reads the same.
    """
    unmarked = [_unmarked(entry) for entry in forwarded]
    return [entry for entry in unmarked if _is_requirement(entry)]


def _unmarked(entry: Any) -> Any:
    content = entry.get("content") if isinstance(entry, dict) else None
    if isinstance(content, list) and len(content) == 1 and "cache_control" in content[0]:
        block = content[0]
        if set(block) == {"type", "text", "cache_control"} and block["type"] == "text":
            return {**entry, "content": block["text"]}
    return entry


def grown(wire: FormatCase, body: dict[str, Any], turns: int) -> dict[str, Any]:
    """`body` with the model's answer and `turns` more turns of lookups and requirements after it."""
    entries = body[wire.entries]
    # Calls of their own: the same ids as the first turns' would answer two calls with one id.
    raw = orjson.dumps(wire.conversation(turns)[wire.entries])
    more = orjson.loads(raw.replace(b':"call_', b':"call_more_').replace(b':"toolu_', b':"toolu_more_'))
    numbered = len([entry for entry in entries if _is_requirement(entry)])
    added = [{"role": "assistant", "content": "Noted."}, *with_requirements(more, numbered)]
    return {**body, wire.entries: [*entries, *added]}


@by_format()
async def test_every_requirement_reaches_the_upstream_and_replays_byte_for_byte(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies
) -> None:
    format_upstream.context_window = 1_000_000
    proxy = await format_proxies.start(context_windows={wire.model: WINDOW})
    body = wire.conversation(16)
    body = {**body, wire.entries: with_requirements(body[wire.entries])}
    sent = [entry for entry in body[wire.entries] if _is_requirement(entry)]

    status, headers, _ = await wire.post(proxy, body)

    assert status == 200 and headers["X-Compaction"] == "compacted"
    first = wire.forwarded(format_upstream)[-1]
    forwarded = wire.entries_of(first)
    assert len(forwarded) < len(body[wire.entries]), "old lookups and answers went"
    assert requirements_in(forwarded) == sent, "every requirement, byte for byte"
    assert first.count(NOTE) == 1

    # The next turn replays the rewrite: what the upstream saw is the prefix of what it sees now.
    status, headers, _ = await wire.post(proxy, wire.next_turn(body))
    assert status == 200
    second = wire.forwarded(format_upstream)[-1]
    prefix = wire.entries_bytes(first)[:-1]
    assert wire.entries_bytes(second).startswith(prefix)

    # Many turns later, a new compaction keeps every requirement again, and folds the first note into its own.
    later = grown(wire, wire.next_turn(body), 16)
    status, headers, _ = await wire.post(proxy, later)
    assert status == 200 and headers["X-Compaction"] == "compacted"
    third = wire.forwarded(format_upstream)[-1]
    expected = [entry for entry in later[wire.entries] if _is_requirement(entry)]
    assert requirements_in(wire.entries_of(third)) == expected
    assert len(expected) == 32
    assert third.count(NOTE) == 1


def upstream_of(wire: FormatCase) -> Upstream:
    """A fresh fake upstream of the format, roomy: only the proxy's window decides (as the suite's fixtures start)."""
    if wire.upstream_fixture == "anthropic_upstream":
        return AnthropicUpstream(responder=tool_loop_responder(tool=None), context_window=1_000_000)
    return OpenAIUpstream(context_window=1_000_000)


async def forwarded_twice(wire: FormatCase, body: dict[str, Any], window: int) -> tuple[list[bytes], list[bytes]]:
    """What two proxies with the same settings forward for `body` and then its next turn, each its own state."""
    async with upstream_of(wire) as upstream:
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={wire.model: window})
        try:
            for proxy in [await proxies.start(), await proxies.start()]:
                for request in (body, wire.next_turn(body)):
                    status, _headers, answer = await wire.post(proxy, request)
                    assert status == 200, answer
            sent = wire.forwarded(upstream)
        finally:
            await proxies.close()
    return sent[:2], sent[2:]


@by_format()
@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.integers(min_value=8, max_value=20),
    paragraphs=st.integers(min_value=8, max_value=16),
    tools=st.booleans(),
    over=st.floats(min_value=1.0, max_value=5.0),
)
def test_random_conversations_keep_the_users_words_the_pairs_and_the_prefix(
    wire: FormatCase, turns: int, paragraphs: int, tools: bool, over: float
) -> None:
    body = wire.conversation(turns, paragraphs, tools=tools)
    body = {**body, wire.entries: with_requirements(body[wire.entries])}
    # About `over` times the window's room (its `compact_to` share) in tokens, at about 6 bytes of body a token: most
    # are compacted, some are not. At 4,000 tokens or more, the requirements (20 tokens each) stay within the share of
    # the room the user's text may take, whatever the tools take of it.
    window = max(4000, int(len(orjson.dumps(body)) / 6 / 0.4 / over))
    sent = [entry for entry in body[wire.entries] if _is_requirement(entry)]

    # The fake upstreams refuse what the API would (a call without its result among them): every answer is a 200.
    first, second = asyncio.run(forwarded_twice(wire, body, window))

    assert first == second, "the same conversation, on another proxy, is forwarded byte for byte the same"
    compacted, next_turn = first
    assert requirements_in(wire.entries_of(compacted)) == sent
    assert wire.entries_bytes(next_turn).startswith(wire.entries_bytes(compacted)[:-1])


def long_requirement(turn: int) -> str:
    """A requirement with a document pasted in, its secret in the middle (what a middle-out cut would lose)."""
    return f"Requirement {turn}: " + PARAGRAPH * 20 + f"SECRET-{1000 + turn} " + PARAGRAPH * 20


@by_format()
async def test_with_offloading_the_users_messages_that_must_go_are_read_back_within_the_target(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies
) -> None:
    wire.use_reading_model(format_upstream)
    format_upstream.context_window = 1_000_000
    window = 12_000
    proxy = await format_proxies.start(context_windows={wire.model: window})
    # No tools: the read tool is the only one the forwarded request can have, and its tokens must fit the target.
    body = {key: value for key, value in wire.conversation(16, paragraphs=4, tools=False).items() if key != "tools"}
    entries = [
        {**entry, "content": long_requirement(int(entry["content"].split()[1][:-1]))}
        if _is_requirement(entry)
        else entry
        for entry in with_requirements(body[wire.entries])
    ]

    status, headers, answer = await wire.post(proxy, {**body, wire.entries: entries})

    assert status == 200, answer
    assert headers["X-Compaction"] == "compacted"
    first = wire.forwarded(format_upstream)[0]
    held = [turn for turn in range(16) if content_reference(long_requirement(turn)).encode() in first]
    assert len(held) >= 2 and headers["X-Compaction-Offloaded"] == str(len(held))
    assert wire.tool_names(first) == [READ_TOOL]
    assert b"User message offloaded" in first
    assert first.count(b"Requirement 0: ") == 1, "the opening requirement stays: whole, cut, or behind its stand-in"
    defaults = Settings()
    target = Thresholds(window, defaults.compact_at, defaults.compact_to, body.get("max_tokens", 0)).target_total
    assert wire.upstream_prompt_tokens(format_upstream)[0] <= target, "the read tool's tokens are within the target"
    # The proxy's cache breakpoints (Messages API) end the compacted prefix and the kept head, never the newest message.
    assert first.count(b'"cache_control"') <= MAX_BREAKPOINTS
    assert wire.entries_of(first)[-1] == entries[-1], "the newest message goes as the client sent it"
    # The model read them back in full (at most `offload_reads_per_answer`, 8, in one answer), secrets and all.
    found = [int(secret) - 1000 for secret in re.findall(r"SECRET-(\d+)", wire.read(answer).text)]
    assert set(found) <= set(held) and len(found) == int(headers["X-Compaction-Reads"]) == min(len(held), 8)
