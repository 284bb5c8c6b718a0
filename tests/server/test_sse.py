"""SSE splitting, usage capture, reply reassembly and usage stripping, chunk boundary by chunk boundary."""

from __future__ import annotations

import json
import random

import pytest

from proxy.server.sse import EventSplitter, StreamObserver, event_data

USAGE = '{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}'
HEADER = '"id":"c1","object":"chat.completion.chunk","created":1,"model":"m"'


def chunk(delta: str, usage: bool) -> bytes:
    tail = ',"usage":null' if usage else ""
    return f'data: {{{HEADER},"choices":[{{"index":0,"delta":{delta},"finish_reason":null}}]{tail}}}\n\n'.encode()


def stream(usage: bool) -> bytes:
    parts = [
        chunk('{"role":"assistant","content":""}', usage),
        chunk('{"content":"Hel"}', usage),
        chunk('{"content":"lo \\u00e9"}', usage),
        chunk(
            '{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}', usage
        ),
        chunk('{"tool_calls":[{"index":0,"function":{"arguments":"{\\"x\\":"}}]}', usage),
        chunk(
            '{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"g","arguments":"{}"}}]}',
            usage,
        ),
        chunk('{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}', usage),
    ]
    if usage:
        parts.append(f'data: {{{HEADER},"choices":[],"usage":{USAGE}}}\n\n'.encode())
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def cuts(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    pieces, start = [], 0
    while start < len(data):
        size = rng.randint(1, 40)
        pieces.append(data[start : start + size])
        start += size
    return pieces


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_splitter_returns_whole_events_whatever_the_chunking(seed: int, newline: bytes) -> None:
    events = [
        b"data: one" + newline + newline,
        b": comment" + newline + b"data: two" + newline + b"data: 2" + newline + newline,
    ]
    data = b"".join(events) * 3
    splitter = EventSplitter()
    out = [event for piece in cuts(data, seed) for event in splitter.feed(piece)]
    rest = splitter.flush()  # a final lone CR could still become CRLF: only the end of the stream settles it
    assert out + ([rest] if rest else []) == events * 3
    assert rest == (events[1] if newline == b"\r" else b"")
    assert [event_data(event) for event in out[:2]] == [b"one", b"two\n2"]


@pytest.mark.parametrize("seed", range(10))
def test_observer_without_stripping_relays_chunks_as_received(seed: int) -> None:
    observer = StreamObserver(strip_usage=False)
    pieces = cuts(stream(usage=True), seed)
    relayed = [observer.feed(piece) for piece in pieces]
    assert relayed == pieces
    assert observer.finish() == b""
    assert observer.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert observer.reply.build() == {
        "role": "assistant",
        "content": "Hello é",
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    }


@pytest.mark.parametrize("seed", range(10))
def test_stripping_gives_the_stream_without_include_usage_byte_for_byte(seed: int) -> None:
    observer = StreamObserver(strip_usage=True)
    relayed = b"".join(observer.feed(piece) for piece in cuts(stream(usage=True), seed)) + observer.finish()
    assert relayed == stream(usage=False)
    assert observer.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert observer.stripped_chunks == 1


def test_stripping_leaves_streams_without_usage_untouched() -> None:
    observer = StreamObserver(strip_usage=True)
    assert observer.feed(stream(usage=False)) + observer.finish() == stream(usage=False)


def test_stripping_falls_back_to_reserializing_odd_json() -> None:
    observer = StreamObserver(strip_usage=True)
    odd = b'data: {"usage": null, "choices": [{"index": 0, "delta": {"content": "x", "usage": null}}]}\r\n\r\n'
    out = observer.feed(odd)
    assert out.endswith(b"\r\n\r\n")
    assert json.loads(event_data(out) or b"") == {"choices": [{"index": 0, "delta": {"content": "x", "usage": None}}]}


def test_unterminated_last_event_is_relayed_and_seen() -> None:
    observer = StreamObserver(strip_usage=True)
    assert observer.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}') == b""
    assert observer.finish() == b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}'
    assert observer.reply.build() == {"role": "assistant", "content": "a"}
