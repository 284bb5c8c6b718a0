"""The user's own words reach the upstream through the real proxy's default chain, in every wire format.

A conversation whose user messages state requirements (short, each with a code to quote) and whose tool results and
answers fill the window goes through the proxy with its default settings (offloading on). Every user message, within
the budget the user text may take, reaches the upstream byte for byte; the next turns replay the rewrite, so the
prefix the upstream saw stays byte-identical, and a later compaction keeps the requirements again with one note.
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import FormatCase, Upstream, by_format

WINDOW = 6000
NOTE = b"earlier assistant and tool messages and"
"""Words of the user message window's omission note."""


def requirement(turn: int) -> str:
    return f"Requirement {turn}: the report quotes code R-{turn:02d} in section {turn}."


def with_requirements(entries: list[Any], first: int = 0) -> list[Any]:
    """The conversation's questions (`Question N: ...` user entries, in every format) turned into requirements."""
    turned: list[Any] = []
    for entry in entries:
        content = entry.get("content") if isinstance(entry, dict) else None
        if entry.get("role") == "user" and isinstance(content, str) and content.startswith("Question "):
            entry = {**entry, "content": requirement(first + len([e for e in turned if _is_requirement(e)]))}
        turned.append(entry)
    return turned


def _is_requirement(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("content"), str) and entry["content"].startswith("Req")


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
    assert [entry for entry in forwarded if _is_requirement(entry)] == sent, "every requirement, byte for byte"
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
    assert [entry for entry in wire.entries_of(third) if _is_requirement(entry)] == expected
    assert len(expected) == 32
    assert third.count(NOTE) == 1
