"""The byte bound a small request is decided on never falls below what the engine counts for it.

`proxy.pipeline.byte_bound` forwards a request untouched when its length in bytes is under the trigger. That is safe
only if no text-only request counts more tokens than it has bytes: here over random conversations (any Unicode, names,
tool calls, tool schemas, compact or indented JSON) with both of tiktoken's encodings, and a request with media is
never bounded by its bytes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import TiktokenCounter
from proxy.pipeline.byte_bound import bytes_bound
from proxy.pipeline.requests import text_only
from tests.support.examples import examples

COUNTERS = [TiktokenCounter("o200k_base"), TiktokenCounter("cl100k_base")]

texts = st.text(max_size=200)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
tool_calls = st.lists(
    st.builds(
        lambda call_id, name, arguments: {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        },
        names,
        names,
        st.dictionaries(names, texts | st.integers(), max_size=3),
    ),
    min_size=1,
    max_size=3,
)
text_parts = st.lists(st.builds(lambda text: {"type": "text", "text": text}, texts), min_size=1, max_size=3)
messages = st.lists(
    st.one_of(
        st.builds(lambda text: {"role": "system", "content": text}, texts),
        st.builds(lambda content: {"role": "user", "content": content}, texts | text_parts),
        st.builds(lambda text, name: {"role": "user", "content": text, "name": name}, texts, names),
        st.builds(lambda calls: {"role": "assistant", "content": None, "tool_calls": calls}, tool_calls),
        st.builds(lambda text, call_id: {"role": "tool", "tool_call_id": call_id, "content": text}, texts, names),
    ),
    min_size=1,
    max_size=8,
)
tools = st.lists(
    st.builds(
        lambda name, description, fields: {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {field: {"type": "string", "description": text} for field, text in fields.items()},
                },
            },
        },
        names,
        texts,
        st.dictionaries(names, texts, max_size=3),
    ),
    max_size=3,
)


@settings(max_examples=examples(200), deadline=None)
@given(messages=messages, tools=tools, indented=st.booleans())
def test_a_text_request_counts_no_more_tokens_than_it_has_bytes(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], indented: bool
) -> None:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": messages, **({"tools": tools} if tools else {})}
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2 if indented else 0)
    assert text_only(messages)
    bound = bytes_bound(raw, 1.0)
    assert bound == len(raw)
    for counter in COUNTERS:
        assert bound >= counter.messages_tokens(messages) + counter.overhead_tokens(body)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-abc"}},
    ],
    ids=["image", "audio", "file"],
)
def test_a_request_with_media_has_no_byte_bound(part: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look."}, part]}]
    assert not text_only(messages)  # so the request is measured the full way, not by its bytes


def test_an_assistant_audio_reply_has_no_byte_bound() -> None:
    messages = [{"role": "assistant", "content": None, "audio": {"id": "audio_abc"}}, {"role": "user", "content": "?"}]
    assert not text_only(messages)


def test_the_bound_follows_the_calibration() -> None:
    messages = [{"role": "user", "content": "hello"}]
    raw = orjson.dumps({"model": "gpt-4o", "messages": messages})
    assert bytes_bound(raw, 1.3) == -(-len(raw) * 13 // 10)
