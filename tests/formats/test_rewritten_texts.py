"""A user message of several text parts that the engine rewrote forwards the rewrite's texts and nothing more.

Claude Code sends a user's turn as text blocks (reminders beside the user's words); the engine may condense such a
message to one text (offloaded behind a reference, cut middle-out). Through each format's mapping back (the Messages
API's blocks, the Responses API's parts), what is forwarded reads exactly the rewrite's texts, in the client's own
parts with what else they carry: no part of the client's keeps words the engine counted as gone.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.responses.items import Units
from tests.support.examples import examples

TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)


@st.composite
def rewrites(draw: st.DrawFn) -> tuple[list[str], Any]:
    """The client's texts (one or more), and an engine rewrite of them: a string, or fewer or as many text parts."""
    sent = draw(st.lists(TEXTS, min_size=1, max_size=5))
    kept = draw(st.lists(TEXTS, min_size=1, max_size=len(sent)))
    as_string = len(kept) == 1 and draw(st.booleans())
    return sent, kept[0] if as_string else [{"type": "text", "text": text} for text in kept]


def texts_of(rewrite: Any) -> list[str]:
    return [rewrite] if isinstance(rewrite, str) else [part["text"] for part in rewrite]


@settings(max_examples=examples(100))
@given(rewrite=rewrites(), marked=st.booleans())
def test_messages_blocks_carry_the_rewrites_texts_alone(rewrite: tuple[list[str], Any], marked: bool) -> None:
    sent, engine_content = rewrite
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in sent]
    if marked:
        blocks[0] = {**blocks[0], "cache_control": {"type": "ephemeral"}}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": blocks}]}
    request = MessagesRequest.parse(orjson.dumps(body))
    (message,) = request.messages
    (forwarded,) = request.mapped([{**message, "content": engine_content}]).messages
    kept = texts_of(engine_content)
    assert [block["text"] for block in forwarded["content"]] == kept
    assert [{**block, "text": ""} for block in forwarded["content"]] == [
        {**block, "text": ""} for block in blocks[: len(kept)]
    ]


@settings(max_examples=examples(100))
@given(rewrite=rewrites())
def test_responses_parts_carry_the_rewrites_texts_alone(rewrite: tuple[list[str], Any]) -> None:
    sent, engine_content = rewrite
    parts = [{"type": "input_text", "text": text} for text in sent]
    units = Units.of([{"type": "message", "role": "user", "content": parts}], None)
    (message,) = units.messages
    (forwarded,), _instructions = units.forwarded_items([{**message, "content": engine_content}])
    kept = texts_of(engine_content)
    assert [part["text"] for part in forwarded["content"]] == kept
    assert all(part["type"] == "input_text" for part in forwarded["content"])
