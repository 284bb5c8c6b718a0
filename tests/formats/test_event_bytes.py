"""Reading stream events from their bytes (`WireFormat.skim_event`) changes nothing a parse of every event finds.

Streams of the three formats, made of their common events written as servers write them and bent every way a
server or a broken upstream could (whitespace, other key orders, escaped keys and texts, duplicate keys, numbers
past 64 bits, a usage where one could be, stray bytes), cut anywhere: an observer that skims relays the same bytes
and finds the same usage, reply, id and stripped chunks as one that parses every event.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.formats.anthropic.wire import MESSAGES
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.formats.responses.answers import FINAL_EVENTS
from proxy.formats.responses.wire import RESPONSES
from proxy.pipeline.wire import WireFormat
from proxy.server.sse import StreamObserver, without_usage_null
from tests.server.test_sse import chunked
from tests.support.examples import examples

TEXTS = st.one_of(st.sampled_from(["", "ok", " world", 'say "hi"\n', "é✓", "\\", "\x7f"]), st.text(max_size=6))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3))
KEYS = st.sampled_from(["id", "model", "usage", "choices", "index", "delta", "type", "text", "role", "obfuscation"])


def rarely(draw: st.DrawFn) -> bool:
    return draw(st.integers(0, 3)) == 0


def chat_chunk(draw: st.DrawFn, text: str) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": draw(st.sampled_from(["assistant", 5])), "content": text}
    if not rarely(draw):
        del delta["role"]
    choice: dict[str, Any] = {"index": 0 if not rarely(draw) else draw(st.sampled_from([1, False])), "delta": delta}
    choice.update({"logprobs": None, "finish_reason": None})
    if rarely(draw):
        choice.update(draw(st.dictionaries(st.sampled_from(["finish_reason", "logprobs", "index"]), SCALARS)))
    chunk: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunk["choices"] = [choice] if not rarely(draw) else draw(st.sampled_from([[choice, choice], []]))
    if rarely(draw):
        chunk["usage"] = draw(st.sampled_from([None, {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}]))
    if rarely(draw):
        chunk.update(draw(st.dictionaries(KEYS, SCALARS, max_size=2)))
    return chunk


def messages_event(draw: st.DrawFn, text: str) -> dict[str, Any]:
    kind, name = draw(st.sampled_from([("text_delta", "text"), ("thinking_delta", "thinking"), ("text_delta", "x")]))
    delta = {"type": kind, name: text}
    index = draw(st.sampled_from([0, 1, 2, -1, True, 10**12]))
    event = draw(
        st.sampled_from(
            [
                {"type": "content_block_delta", "index": index, "delta": delta},
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": text}},
                {"type": "content_block_stop", "index": index},
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
                {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 5, "output_tokens": 1}}},
                {"type": "ping"},
            ]
        )
    )
    event.update(draw(st.dictionaries(KEYS, SCALARS, max_size=1)))
    return event


def responses_event(draw: st.DrawFn, text: str) -> dict[str, Any]:
    response = {"id": "resp_1", "output": [{"type": "message", "role": "assistant", "content": []}], "usage": None}
    response["usage"] = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
    kind = draw(st.sampled_from(["response.output_text.delta", "response.created", "response.completed"]))
    event: dict[str, Any] = {"type": kind, "item_id": "msg_1", "output_index": 0, "delta": text}
    if kind != "response.output_text.delta":
        event["response"] = response
    return event


MAKERS = {CHAT_COMPLETIONS.name: chat_chunk, MESSAGES.name: messages_event, RESPONSES.name: responses_event}


@st.composite
def event_data(draw: st.DrawFn, wire: WireFormat) -> bytes:
    """One event's data: a common event of `wire`, written compact or spaced, ASCII or not, perhaps mangled."""
    event = MAKERS[wire.name](draw, draw(TEXTS))
    compact = not rarely(draw)
    data = json.dumps(
        event, separators=(",", ":") if compact else (", ", ": "), ensure_ascii=draw(st.booleans())
    ).encode()
    mangling = draw(st.integers(0, 5))
    if mangling == 0:  # a stray byte: broken JSON, a text cut short, not UTF-8
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b'"', b"\\", b"\x01", b"\xff", b"}"])) + data[at:]
    elif mangling == 1:  # a member more at the end of an object: a duplicate key, a usage, an escaped key
        ends = [at for at, byte in enumerate(data) if byte == ord("}")]
        at = draw(st.sampled_from(ends))
        data = data[:at] + draw(st.sampled_from(DUPLICATES)) + data[at:]
    return data


DUPLICATES = [
    *(b',"index":1', b',"choices":[]', b',"delta":{}', b',"role":"user"', b',"usage":null', b',"text":"z"'),
    *(b',"us\\u0061ge":{"prompt_tokens":1}', b',"content":"q"', b',"x":"\xff"', b',"n":1e5', b',"type":"ping"'),
]


@st.composite
def streams(draw: st.DrawFn) -> tuple[WireFormat, bytes]:
    wire = draw(st.sampled_from([CHAT_COMPLETIONS, MESSAGES, RESPONSES]))
    newline = draw(st.sampled_from([b"\n", b"\n", b"\r\n"]))
    prefix = draw(st.sampled_from([b"data: ", b"data:", b"event: e" + newline + b"data: "]))
    events = draw(st.lists(event_data(wire), max_size=12))
    return wire, b"".join(prefix + data + newline + newline for data in events) + b"data: [DONE]\n\n"


@settings(max_examples=examples(500), deadline=None)
@given(stream=streams(), cut_points=st.lists(st.integers(min_value=0), max_size=8), strip=st.booleans())
def test_skimming_finds_what_parsing_every_event_finds(
    stream: tuple[WireFormat, bytes], cut_points: list[int], strip: bool
) -> None:
    wire, data = stream
    skimming = StreamObserver(wire, strip_usage=strip)
    parsing = StreamObserver(wire, strip_usage=strip, skim=False)
    pieces = chunked(data, cut_points)
    assert [skimming.feed(piece) for piece in pieces] + [skimming.finish()] == [
        parsing.feed(piece) for piece in pieces
    ] + [parsing.finish()]
    found = (skimming.usage, skimming.reply, skimming.report.response_id, skimming.stripped_chunks, skimming.stopped)
    assert found == (parsing.usage, parsing.reply, parsing.report.response_id, parsing.stripped_chunks, parsing.stopped)


def test_the_common_events_are_skimmed() -> None:
    """The events servers write most are the ones read from their bytes (else skimming would save nothing)."""
    common = {
        CHAT_COMPLETIONS: b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"content":"hi \\"x\\"\\n"},"logprobs":null,"finish_reason":null}],"obfuscation":"a"}',
        MESSAGES: b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}',
        RESPONSES: b'{"type":"response.output_text.delta","item_id":"m","output_index":0,"delta":"hi"}',
    }
    for wire, data in common.items():
        observer = StreamObserver(wire, strip_usage=False)
        assert all(wire.skim_event(data, observer.report) for _ in range(2)), wire.name


@st.composite
def openai_chunks(draw: st.DrawFn, *, include_usage: bool) -> list[bytes]:
    """A chat stream's data as OpenAI writes it: role, text or tool-call deltas, the finish, perhaps the usage.

    Under `include_usage` every chunk has `"usage":null` but the last, which has the usage and no choices; the
    `obfuscation` member (on by default) follows it.
    """
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    obfuscated = draw(st.booleans())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body: dict[str, Any] = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        if obfuscated:
            body["obfuscation"] = draw(st.text("abcXYZ", max_size=6))
        return json.dumps(body, separators=(",", ":"), ensure_ascii=draw(st.booleans())).encode()

    deltas = draw(st.lists(st.one_of(TEXTS.map(lambda text: {"content": text}), TEXTS.map(arguments)), max_size=8))
    chunks = [chunk({"role": "assistant", "content": "", "refusal": None}), *map(chunk, deltas), chunk({}, "stop")]
    if include_usage:
        usage = {"prompt_tokens": 5, "completion_tokens": len(deltas), "total_tokens": 5 + len(deltas)}
        chunks.append(json.dumps({**head, "choices": [], "usage": usage}, separators=(",", ":")).encode())
    return chunks


def arguments(text: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


def sse(chunks: list[bytes]) -> bytes:
    return b"".join(b"data: " + data + b"\n\n" for data in chunks) + b"data: [DONE]\n\n"


@settings(max_examples=examples(300), deadline=None)
@given(
    chunks=openai_chunks(include_usage=True),
    cut_points=st.lists(st.integers(min_value=0), max_size=8),
    strip=st.booleans(),
)
def test_a_stream_that_includes_usage_is_skimmed_to_what_parsing_finds(
    chunks: list[bytes], cut_points: list[int], strip: bool
) -> None:
    """Every chunk's `"usage":null` (OpenAI's, under `include_usage`) is skimmed past; stripped, it is not relayed."""
    with_usage = sse(chunks)
    skimming = StreamObserver(CHAT_COMPLETIONS, strip_usage=strip)
    parsing = StreamObserver(CHAT_COMPLETIONS, strip_usage=strip, skim=False)
    pieces = chunked(with_usage, cut_points)
    relayed = [skimming.feed(piece) for piece in pieces] + [skimming.finish()]
    assert relayed == [parsing.feed(piece) for piece in pieces] + [parsing.finish()]
    assert skimming.usage == parsing.usage is not None
    assert (skimming.reply, skimming.stripped_chunks) == (parsing.reply, parsing.stripped_chunks)
    if strip:
        without = with_usage.replace(b',"usage":null', b"")
        assert b"".join(relayed) == without[: without.rindex(b"data: {")] + b"data: [DONE]\n\n"


def test_the_chunks_of_a_stream_that_includes_usage_are_skimmed() -> None:
    """A text chunk under `include_usage` is a text chunk once its `"usage":null` is cut (`without_usage_null`)."""
    data = (
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"content":"hi"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"a"}'
    )
    bare = without_usage_null(data)
    assert bare == data.replace(b',"usage":null', b"")
    assert CHAT_COMPLETIONS.skim_event(bare, StreamObserver(CHAT_COMPLETIONS, strip_usage=True).report)


def test_a_usage_null_is_stripped_only_from_a_chunk_that_parses() -> None:
    """A skim says what a parse would read, not that one would succeed: broken bytes are relayed as they came."""
    broken = b'data: {"type":"response.output_text.delta","delta":"1,"usage":null}\n\n'
    for wire in (RESPONSES, CHAT_COMPLETIONS):
        skimming, parsing = (StreamObserver(wire, strip_usage=True, skim=skim) for skim in (True, False))
        assert skimming.feed(broken) == parsing.feed(broken) == broken


def test_every_final_event_of_the_responses_api_is_left_to_the_parse() -> None:
    """The Responses API's skim looks for `complete`, which every final event's type names: none is skimmed."""
    for kind in FINAL_EVENTS:
        data = json.dumps({"type": kind, "response": {"id": "r"}}, separators=(",", ":")).encode()
        assert not RESPONSES.skim_event(data, StreamObserver(RESPONSES, strip_usage=False).report)
