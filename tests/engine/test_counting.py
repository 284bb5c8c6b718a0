"""Counting against tiktoken on real text, and the approximate counter's documented error."""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import email
import inspect
import json
import logging
import pathlib
import struct
import textwrap
import types
import typing
import unittest
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import ApproximateCounter, TiktokenCounter
from proxy.engine.counting import REPLY_PRIMING_TOKENS, encoding_for_model, render_tool_schemas
from proxy.engine.encodings import get_encoding
from proxy.engine.images import DEFAULT_IMAGE_TOKENS, image_tokens, tiled_image_tokens
from proxy.engine.messages import message_key
from tests.support.examples import examples

MODULES = [json, argparse, asyncio, collections, email, logging, pathlib, textwrap, unittest, typing]
PROSE = "\n\n".join(module.__doc__ or "" for module in MODULES)
CODE = "\n".join(inspect.getsource(module) for module in (json, textwrap, pathlib))
NUMERIC_JSON = json.dumps({"rows": [{"id": i, "price": i * 1.5, "tags": ["a", "b"]} for i in range(400)]})


def cookbook_count(messages: list[dict[str, str]], encoding: str) -> int:
    """OpenAI's published recipe, written out independently of our counter."""
    encoder = get_encoding(encoding)
    total = 0
    for message in messages:
        total += 3
        for key, value in message.items():
            total += len(encoder.encode_ordinary(value))
            if key == "name":
                total += 1
    return total + 3


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_messages_count_as_openai_cookbook(encoding: str) -> None:
    messages = [
        {"role": "system", "content": PROSE[:3000]},
        {"role": "user", "name": "alice", "content": CODE[:5000]},
        {"role": "assistant", "content": "Ünïcödé 中文 🎉 <|endoftext|>"},
    ]
    counter = TiktokenCounter(encoding)
    assert counter.messages_tokens(messages) + counter.overhead_tokens() == cookbook_count(messages, encoding)
    assert counter.overhead_tokens() == REPLY_PRIMING_TOKENS


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [(PROSE, 0.0, 0.10), (CODE, 0.0, 0.10), (NUMERIC_JSON, -0.50, -0.35)],
    ids=["prose", "code", "numeric-json"],
)
def test_approximate_counter_error_is_as_documented(text: str, low: float, high: float) -> None:
    exact = TiktokenCounter().text_tokens(text)
    approximate = ApproximateCounter().text_tokens(text)
    assert low <= (approximate - exact) / exact <= high


def test_utf8_bytes_bound_tiktoken_counts_from_above() -> None:
    counter = TiktokenCounter()
    for text in (PROSE, CODE, NUMERIC_JSON, "中文字符 " * 50, "🎉" * 30):
        assert counter.text_upper_bound(text) >= counter.text_tokens(text)
        message = {"role": "user", "content": text}
        assert counter.message_upper_bound(message) >= counter.message_tokens(message)


def test_counts_are_cached_per_message() -> None:
    counter = TiktokenCounter()
    message = {"role": "user", "content": CODE}
    first = counter.message_tokens(message)
    # An equal message built anew is served from the cache: same key, same count.
    assert counter.message_tokens({"content": CODE, "role": "user"}) == first
    assert len(counter._cache) == 1


def test_a_keyed_bound_is_remembered_and_stays_the_bound_once_the_count_is_known() -> None:
    counter = TiktokenCounter()
    message = {"role": "user", "content": PROSE}
    key = message_key(message)
    bound = counter.message_upper_bound(message, key)
    assert bound == counter.message_upper_bound(message) > counter.message_tokens(message, key)
    # Served from the cache: the same value for an equal message built anew, and never the (now known) count.
    assert counter.message_upper_bound({"content": PROSE, "role": "user"}, key) == bound
    assert len(counter._bounds) == 1


def test_reply_resent_by_an_sdk_counts_and_hashes_the_same() -> None:
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}],
    }
    resent = {
        **reply,
        "refusal": None,
        "annotations": [],
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b":2,"a":1}'}}],
    }
    assert message_key(reply) == message_key(resent)
    counter = TiktokenCounter()
    assert counter.message_tokens(resent) == counter.message_tokens(reply)


@settings(max_examples=examples(200))
@given(role=st.sampled_from(["user", "assistant", "system", "tool"]), text=st.text(), other=st.text())
def test_one_text_part_keys_and_counts_as_its_text(role: str, text: str, other: str) -> None:
    # A client moving its cache breakpoint sends its newest message as a text block, then as a string.
    as_string = {"role": role, "content": text}
    as_part = {"role": role, "content": [{"type": "text", "text": text}]}
    assert message_key(as_part) == message_key(as_string)
    assert TiktokenCounter().message_tokens(as_part) == TiktokenCounter().message_tokens(as_string)
    # Two parts, or a part carrying more than its text, are not read as one string.
    two = {"role": role, "content": [{"type": "text", "text": text}, {"type": "text", "text": other}]}
    assert message_key(two) != message_key({"role": role, "content": text + other})
    marked = {"role": role, "content": [{"type": "text", "text": text, "detail": other}]}
    assert message_key(marked) != message_key(as_string)


_CALLS = st.lists(
    st.fixed_dictionaries(
        {"id": st.text(max_size=8), "function": st.fixed_dictionaries({"name": st.text(), "arguments": st.text()})}
    ),
    max_size=3,
)


@settings(max_examples=examples(200))
@given(calls=_CALLS, text=st.text())
def test_a_message_with_calls_keys_by_what_the_model_reads(calls: list[dict[str, typing.Any]], text: str) -> None:
    # Null, empty and absent content read alike; so do calls as dicts and as other mappings.
    null = {"role": "assistant", "content": None, "tool_calls": calls}
    key = message_key(null)
    assert message_key({"role": "assistant", "content": "", "tool_calls": calls}) == key
    assert message_key({"role": "assistant", "tool_calls": calls}) == key
    proxied = [types.MappingProxyType({**call, "function": types.MappingProxyType(call["function"])}) for call in calls]
    assert message_key(types.MappingProxyType({**null, "tool_calls": proxied})) == key
    # One call more, or text beside them, is another message; no calls at all is the bare text.
    assert message_key({**null, "tool_calls": [*calls, {"id": "x", "function": {"name": "f"}}]}) != key
    assert message_key({"role": "assistant", "content": text, "tool_calls": []}) == message_key(
        {"role": "assistant", "content": text}
    )
    if text:
        assert message_key({**null, "content": text}) != key


def _png(width: int, height: int) -> bytes:
    header = (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    )
    return header + struct.pack(">I", zlib.crc32(header[12:])) + b"\0" * 1000


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHH", 17, 8, height, width) + b"\x03" + b"\0" * 9
    return b"\xff\xd8" + app0 + sof + b"\0" * 100


def _gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 20


def _webp(width: int, height: int) -> bytes:
    return (
        b"RIFF"
        + b"\0" * 4
        + b"WEBPVP8X"
        + b"\0" * 8
        + (width - 1).to_bytes(3, "little")
        + (height - 1).to_bytes(3, "little")
    )


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize(
    ("mime", "make"), [("image/png", _png), ("image/jpeg", _jpeg), ("image/gif", _gif), ("image/webp", _webp)]
)
def test_images_are_counted_by_tiles_not_base64(mime: str, make: typing.Any) -> None:
    url = _data_url(mime, make(1024, 1024))
    assert image_tokens(url) == 765
    assert image_tokens(_data_url(mime, make(4096, 2048))) == tiled_image_tokens(4096, 2048) == 1105
    assert image_tokens(url, "low") == 85
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}],
    }
    counter = TiktokenCounter()
    assert counter.message_tokens(message) < 800


def test_remote_or_unreadable_images_get_the_documented_default() -> None:
    assert image_tokens("https://example.com/cat.png") == DEFAULT_IMAGE_TOKENS
    assert image_tokens("data:image/png;base64,!!!!") == DEFAULT_IMAGE_TOKENS


def test_tool_schemas_count_as_rendered_namespace() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Where it is."},
                        "mode": {"type": "string", "enum": ["text", "bytes"]},
                    },
                    "required": ["path"],
                },
            },
        }
    ]
    rendered = render_tool_schemas(tools)
    assert "type read_file = (_: {" in rendered and 'mode?: "text" | "bytes",' in rendered
    counter = TiktokenCounter()
    assert counter.overhead_tokens({"tools": tools}) == REPLY_PRIMING_TOKENS + counter.text_tokens(rendered)


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("llama-3-70b", "o200k_base"),
        (None, "o200k_base"),
    ],
)
def test_encoding_is_chosen_from_the_model_name(model: str | None, encoding: str) -> None:
    assert encoding_for_model(model) == encoding


def test_approximate_counter_refuses_a_non_positive_ratio() -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        ApproximateCounter(chars_per_token=0)
