"""SSE splitting, usage capture, reply reassembly and usage stripping, chunk boundary by chunk boundary; and what
a hostile upstream can send (odd shapes, exceptions, limits, bombs, arbitrary bytes) never raising nor losing a byte."""

from __future__ import annotations

import gzip
import itertools
import json
import operator
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import UpstreamOutcome
from proxy.server.decoding import DecodingObserver, decoded, inflation_allowance, outcome_from_body
from proxy.server.sse import (
    MAX_PENDING,
    EventSplitter,
    StopReason,
    StreamObserver,
    data_lines,
    event_data,
    rewrite_event,
    without_usage_null,
)
from tests.support.examples import examples

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
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=False)
    pieces = cuts(stream(usage=True), seed)
    relayed = [observer.feed(piece) for piece in pieces]
    assert relayed == pieces
    assert observer.finish() == b""
    assert observer.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert observer.reply == {
        "role": "assistant",
        "content": "Hello é",
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    }


@pytest.mark.parametrize("seed", range(10))
def test_stripping_gives_the_stream_without_include_usage_byte_for_byte(seed: int) -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=True)
    relayed = b"".join(observer.feed(piece) for piece in cuts(stream(usage=True), seed)) + observer.finish()
    assert relayed == stream(usage=False)
    assert observer.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert observer.stripped_chunks == 1


def test_stripping_leaves_streams_without_usage_untouched() -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=True)
    assert observer.feed(stream(usage=False)) + observer.finish() == stream(usage=False)


def test_stripping_falls_back_to_reserializing_odd_json() -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=True)
    odd = b'data: {"usage": null, "choices": [{"index": 0, "delta": {"content": "x", "usage": null}}]}\r\n\r\n'
    out = observer.feed(odd)
    assert out.endswith(b"\r\n\r\n")
    assert json.loads(event_data(out) or b"") == {"choices": [{"index": 0, "delta": {"content": "x", "usage": None}}]}


def test_unterminated_last_event_is_relayed_and_seen() -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=True)
    assert observer.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}') == b""
    assert observer.finish() == b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}'
    assert observer.reply == {"role": "assistant", "content": "a"}


# Hostile upstreams: odd shapes, exceptions, limits and arbitrary bytes never raise and never lose a byte.

MALFORMED = [
    b'data: {"choices": 5}\n\n',
    b'data: {"choices": [5, {"index": 0, "delta": [1]}]}\n\n',
    b'data: {"choices": [{"index": 0, "delta": {"tool_calls": 5, "function_call": 7, "content": 3}}]}\n\n',
    b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "x"}, {"function": 3}, 4]}}]}\n\n',
    b'data: {"usage": 5, "choices": {"0": 1}}\n\n',
    b"data: [1, 2\n\n",
    b"data: \xff\xfe\n\n",
    b"data: 123456789012345678901234567890\n\n",
]


@pytest.mark.parametrize("strip", [False, True])
def test_malformed_chunks_are_relayed_and_skipped_by_inspection(strip: bool) -> None:
    data = chunk('{"content":"a"}', False) + b"".join(MALFORMED) + chunk('{"content":"b"}', False)
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=strip)
    assert b"".join(observer.feed(piece) for piece in cuts(data, 1)) + observer.finish() == data
    assert observer.stopped is None
    assert observer.reply == {"role": "assistant", "content": "ab", "tool_calls": [ANY_TOOL_CALL]}


ANY_TOOL_CALL = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
"""What `{"function": 3}` (a tool call with nothing usable) leaves in the reply."""

UNREMOVABLE_USAGE_NULL = b'data: {"usage":null,"usage":null,"choices":[],"deep":' + b"[" * 300 + b"]" * 300 + b"}\n\n"
"""Removing its `"usage": null` raises: no textual cut re-parses equal, and orjson re-serializes 254 levels at most."""


def test_an_exception_while_stripping_stops_inspection_and_releases_every_held_byte() -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=True)
    before, after = chunk('{"content":"a"}', True), chunk('{"content":"b"}', True)
    assert observer.feed(before + UNREMOVABLE_USAGE_NULL[:30]) == chunk('{"content":"a"}', False)
    assert observer.feed(UNREMOVABLE_USAGE_NULL[30:] + after[:10]) == UNREMOVABLE_USAGE_NULL + after[:10]
    assert (observer.stopped, observer.error) == (StopReason.ERROR, "TypeError")
    assert observer.feed(after[10:]) == after[10:]
    assert observer.finish() == b""


@pytest.mark.parametrize("strip", [False, True])
def test_an_event_past_the_pending_limit_stops_inspection_and_is_relayed_whole(strip: bool) -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=strip)
    head = chunk('{"content":"a"}', strip)
    huge = b"data: " + b"x" * (MAX_PENDING + 1)
    relayed = observer.feed(head) + observer.feed(huge) + observer.feed(b"\n\n" + head) + observer.finish()
    assert relayed == (head if not strip else chunk('{"content":"a"}', False)) + huge + b"\n\n" + head
    assert observer.stopped is StopReason.EVENT_TOO_LONG


def test_a_gzip_bomb_is_inflated_for_inspection_only_up_to_its_allowance() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = compressor.compress(chunk('{"content":"a"}', False) + b"\n" * (16 << 20)) + compressor.flush()
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=False)
    decoding = DecodingObserver(observer, "gzip")
    assert [decoding(piece) for piece in cuts(bomb, 2)] == cuts(bomb, 2)
    assert observer.stopped is StopReason.INFLATION_LIMIT
    assert decoding.inflated <= inflation_allowance(len(bomb))
    assert observer.reply == {"role": "assistant", "content": "a"}


def test_a_stream_that_is_not_gzip_stops_inspection_and_is_relayed() -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=False)
    decoding = DecodingObserver(observer, "gzip")
    assert decoding(b"not gzip at all") == b"not gzip at all"
    assert observer.stopped is StopReason.UNDECODABLE


@pytest.mark.parametrize(
    "body",
    [
        b'{"choices": 5, "usage": 7}',
        b'{"choices": [5, {"index": 0, "message": [1]}], "usage": [1]}',
        b'{"choices": [{"index": 0, "message": {"role": "assistant"}}], "usage": {"prompt_tokens": 1e300}}',
        b'{"usage": {"prompt_tokens": 123456789012345678901234567890}}',
        b"[1, 2",
        b"\xff",
        b"5",
    ],
)
def test_odd_non_streamed_answers_never_raise(body: bytes) -> None:
    outcome = outcome_from_body(CHAT_COMPLETIONS, 200, body, "identity")
    assert outcome.usage is None or isinstance(outcome.usage, dict)
    assert outcome.reply is None or isinstance(outcome.reply, dict)
    assert isinstance(outcome_from_body(CHAT_COMPLETIONS, 400, body, "identity"), UpstreamOutcome)


def test_a_compressed_non_streamed_answer_is_not_inflated_past_its_allowance() -> None:
    bomb = gzip.compress(b'{"usage": {"prompt_tokens": 1}, "pad": "' + b" " * (8 << 20) + b'"}')
    assert decoded(bomb, "gzip") is None
    assert outcome_from_body(CHAT_COMPLETIONS, 200, bomb, "gzip") == UpstreamOutcome(status=200)
    small = gzip.compress(b'{"usage": {"prompt_tokens": 1}}')
    assert outcome_from_body(CHAT_COMPLETIONS, 200, small, "gzip").usage == {"prompt_tokens": 1}


CHUNK_KEYS = st.sampled_from(
    ["choices", "delta", "index", "content", "tool_calls", "function", "function_call", "name", "arguments", "role",
     "refusal", "id", "type", "usage", "prompt_tokens"]
)  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(CHUNK_KEYS, inner, max_size=4),
    max_leaves=12,
)
"""Chunk-like JSON with any member of any type: what a broken upstream can put where a chat chunk has its fields."""
LINE_END = st.sampled_from([b"\n", b"\r\n", b"\r"])
FIELD_LINE = st.one_of(
    st.dictionaries(CHUNK_KEYS, JSON_VALUES, max_size=4).map(lambda chunk: b"data: " + json.dumps(chunk).encode()),
    st.sampled_from([b"data: [DONE]", b"data", b"data:", b": comment", b"event: e", b"id: 1", b"data: {", b""]),
    st.binary(max_size=8),
)
SSE_LIKE = st.lists(st.tuples(FIELD_LINE, LINE_END), max_size=30).map(
    lambda lines: b"".join(line + end for line, end in lines)
)


def chunked(data: bytes, cut_points: list[int]) -> list[bytes]:
    bounds = sorted({point % (len(data) + 1) for point in cut_points} | {0, len(data)})
    return [data[start:end] for start, end in itertools.pairwise(bounds) if end > start]


@settings(max_examples=examples(300), deadline=None)
@given(data=SSE_LIKE, cut_points=st.lists(st.integers(min_value=0), max_size=20))
def test_without_stripping_the_observer_relays_exactly_the_upstream_bytes(data: bytes, cut_points: list[int]) -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=False)
    pieces = chunked(data, cut_points)
    assert [observer.feed(piece) for piece in pieces] == pieces
    assert observer.finish() == b""
    assert observer.stopped in (None, StopReason.EVENT_TOO_LONG)


@settings(max_examples=examples(300), deadline=None)
@given(data=SSE_LIKE, cut_points=st.lists(st.integers(min_value=0), max_size=20))
def test_stripping_never_raises_and_leaves_a_stream_without_usage_as_it_was(data: bytes, cut_points: list[int]) -> None:
    observer = StreamObserver(CHAT_COMPLETIONS, strip_usage=True)
    relayed = b"".join(observer.feed(piece) for piece in chunked(data, cut_points)) + observer.finish()
    if b"usage" not in data:
        assert relayed == data


@settings(max_examples=examples(300), deadline=None)
@given(data=SSE_LIKE, cut_points=st.lists(st.integers(min_value=0), max_size=20))
def test_splitting_loses_nothing_and_finds_the_same_events_however_chunked(data: bytes, cut_points: list[int]) -> None:
    splitter = EventSplitter()
    events = [event for piece in chunked(data, cut_points) for event in splitter.feed(piece)]
    rest = splitter.flush()
    assert b"".join(events) + rest == data
    whole = EventSplitter()
    whole_events = whole.feed(data)
    whole_rest = whole.flush()

    def fields(found: list[bytes]) -> list[bytes]:  # runs of blank lines may come in other pieces; events may not
        return [event for event in found if event.strip(b"\r\n")]

    assert fields(events) == fields(whole_events)
    assert rest == whole_rest or not rest.strip(b"\r\n")
    blank = [not event.strip(b"\r\n") for event in whole_events]
    assert not any(itertools.starmap(operator.and_, itertools.pairwise(blank)))  # a run of blank lines: one piece


@settings(max_examples=examples(300), deadline=None)
@given(chunk=st.one_of(SSE_LIKE, st.lists(FIELD_LINE.map(lambda line: line + b"\n\n"), min_size=1).map(b"".join)))
def test_a_chunk_of_data_lines_is_cut_as_the_splitter_and_event_data_cut_it(chunk: bytes) -> None:
    lines = data_lines(chunk)
    if lines is not None:
        splitter = EventSplitter()
        assert splitter.feed(chunk) == [line + b"\n\n" for line in lines]
        assert [event_data(line + b"\n\n") for line in lines] == [
            line[6:] if line[5:6] == b" " else line[5:] for line in lines
        ]


@settings(max_examples=examples(300), deadline=None)
@given(data=SSE_LIKE, strip=st.booleans())
def test_an_event_a_chunk_is_relayed_and_read_as_the_stream_cut_anywhere_else(data: bytes, strip: bool) -> None:
    splitter = EventSplitter()
    events = [*splitter.feed(data), splitter.flush()]
    one_by_one, whole = (
        StreamObserver(CHAT_COMPLETIONS, strip_usage=strip),
        StreamObserver(CHAT_COMPLETIONS, strip_usage=strip),
    )
    relayed = b"".join(one_by_one.feed(event) for event in events)
    assert relayed + one_by_one.finish() == whole.feed(data) + whole.finish()
    assert (one_by_one.usage, one_by_one.reply, one_by_one.stripped_chunks, one_by_one.stopped) == (
        whole.usage,
        whole.reply,
        whole.stripped_chunks,
        whole.stopped,
    )


@st.composite
def usage_null_data(draw: st.DrawFn) -> bytes:
    """An event's data with a `"usage":null` member somewhere (compact or not, at any depth), perhaps mangled."""
    chunk = draw(st.dictionaries(CHUNK_KEYS, JSON_VALUES, max_size=4))
    data = json.dumps(chunk, separators=(",", ":") if draw(st.booleans()) else (", ", ": ")).encode()
    ends = [at for at, byte in enumerate(data) if byte in b"}],"]
    at = draw(st.sampled_from(ends)) if ends else len(data)
    member = draw(st.sampled_from([b',"usage":null', b'"usage":null,', b', "usage": null', b',"usage":{}']))
    data = data[:at] + member + data[at:]
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b'"', b"\\", b"}", b"]", b",", b'"x":1', b"\xff"])) + data[at:]
    return data


def parsed(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return "unparsable"


@settings(max_examples=examples(1000), deadline=None)
@given(data=usage_null_data())
def test_a_usage_null_cut_from_the_bytes_is_the_top_level_member_a_parse_finds(data: bytes) -> None:
    """What `without_usage_null` cuts is a top-level `"usage": null`: the rest parses to the object without it."""
    bare = without_usage_null(data)
    if bare is None:
        return
    whole = parsed(data)
    if isinstance(whole, dict):
        assert whole.pop("usage", "missing") is None
        assert parsed(bare) == whole
    else:
        assert not isinstance(parsed(bare), dict)


def test_the_usage_null_of_an_openai_chunk_is_cut_wherever_the_top_level_members_put_it() -> None:
    tail = b',"logprobs":null,"finish_reason":null}]'
    head = b'{"id":"c","choices":[{"index":0,"delta":{"content":"a,\\"usage\\":null}"}' + tail
    assert without_usage_null(head + b',"usage":null}') == head + b"}"
    assert without_usage_null(head + b',"usage":null,"obfuscation":"x}","n":1}') == head + b',"obfuscation":"x}","n":1}'
    for kept in (b',"usage":null,"o":{}}', b',"usage":null}}', b',"usage": null}', b',"usage":null,"usage":null}'):
        assert without_usage_null(head + kept) is None


@settings(max_examples=examples(300), deadline=None)
@given(stream=SSE_LIKE, data=st.binary(max_size=20).filter(lambda data: b"\r" not in data and b"\n" not in data))
def test_a_rewritten_event_has_the_new_data_and_keeps_every_other_line(stream: bytes, data: bytes) -> None:
    def others(event: bytes) -> list[bytes]:
        lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        return [line for line in lines if line and not line.startswith(b"data:") and line != b"data"]

    for event in EventSplitter().feed(stream):  # whole events, as the observer rewrites them
        if event_data(event) is not None:
            rewritten = rewrite_event(event, data)
            assert event_data(rewritten) == data
            assert others(rewritten) == others(event)
