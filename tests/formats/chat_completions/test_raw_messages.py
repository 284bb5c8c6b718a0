"""The byte matcher: a body is recognized as a remembered one plus new messages exactly when it is one.

Whatever a client's JSON looks like (its spacing, brackets and quotes inside strings, escapes), a body that inserts
messages before the `]` of a remembered body is recognized, and gives the very request parsing it in full gives;
anything else (other spacing, a field changed, a trick with brackets or duplicate keys) is not.
"""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.formats.chat_completions.raw_messages import appended_messages, messages_end, opening_ends
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.chat_completions.splice import Splices
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.requests import RequestLimits
from proxy.pipeline.turn import Turn

SCOPE = b"tenant"
LIMITS = RequestLimits(max_messages=100, max_content_parts=100)

TRICKY = [
    {"role": "system", "content": 'brackets ] } [ { and "quotes" and a backslash \\'},
    {"role": "user", "content": 'ends in a backslash \\\\", "messages": [] ]}'},
    {"role": "user", "content": "unicode: über 数据 \u2028 \U0001f600 \x1b[0m"},
]
NEW = [{"role": "assistant", "content": "] a reply }"}, {"role": "user", "content": '\\"more\\"'}]


async def remembered(raw: bytes) -> Splices:
    splices = Splices(LIMITS, max_bytes=2**20, on_failure=pytest.fail)
    await splices.remember(SCOPE, raw, ChatRequest.parse(raw), Turn(), OffLoop())
    return splices


def recognized(splices: Splices, raw: bytes) -> ChatRequest | None:
    matched = splices.match(SCOPE, raw, opening_ends(raw))
    extension = splices.extension(*matched) if matched else None
    return extension.request if extension else None


@pytest.mark.parametrize(
    "dumps",
    [
        orjson.dumps,
        lambda body: json.dumps(body).encode(),
        lambda body: json.dumps(body, indent=4).encode(),
        lambda body: json.dumps(body, separators=(" , ", " : "), ensure_ascii=False).encode() + b"\n",
    ],
    ids=["orjson", "python", "indented", "odd-spacing"],
)
@pytest.mark.parametrize("first", [True, False], ids=["messages-first", "messages-inside"])
async def test_a_body_with_messages_inserted_is_recognized_as_its_full_parse(dumps: object, first: bool) -> None:
    def body(messages: list[dict[str, str]]) -> bytes:
        fields = {"messages": messages, "model": "m"} if first else {"model": "m", "messages": messages, "n": 1}
        return dumps(fields)  # type: ignore[operator]

    splices = await remembered(body(TRICKY))
    for grown in (TRICKY, [*TRICKY, NEW[0]], [*TRICKY, *NEW]):
        raw = body(grown)
        assert recognized(splices, raw) == ChatRequest.parse(raw)


async def test_a_client_that_reserializes_with_other_spacing_is_not_recognized() -> None:
    splices = await remembered(orjson.dumps({"model": "m", "messages": TRICKY}))
    assert recognized(splices, json.dumps({"model": "m", "messages": [*TRICKY, *NEW]}).encode()) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda messages: [{**messages[0], "content": "edited"}, *messages[1:], *NEW],
        lambda messages: messages[:-1] + NEW,
        lambda messages: [*messages, {"role": "user", "content": ["not", "closed"]}][:2],
    ],
    ids=["earlier-message-edited", "last-message-replaced", "shorter"],
)
async def test_a_changed_history_is_not_recognized(change: object) -> None:
    splices = await remembered(orjson.dumps({"model": "m", "messages": TRICKY}))
    changed = change(TRICKY)  # type: ignore[operator]
    assert recognized(splices, orjson.dumps({"model": "m", "messages": changed})) is None


async def test_a_changed_field_after_the_messages_is_not_recognized() -> None:
    splices = await remembered(orjson.dumps({"messages": TRICKY, "temperature": 0.5}))
    assert recognized(splices, orjson.dumps({"messages": [*TRICKY, *NEW], "temperature": 0.7})) is None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages":[{"a":1}],"z":[{}],"z":2}',
        b'{"messages":[{"a":1}],"messages":[{"b":2}]}',
        b'{"\\u006dessages":[{"a":1}],"messages":[{"b":2}]}',
        b'{"messages":[]}',
        b'{"messages":[{"a":1},2]}',
        b'{"messages":[{"a":1}],"t":0.' + b"1" * 100 + b"}",
    ],
    ids=[
        "duplicate-field-inside",
        "duplicate-messages",
        "escaped-duplicate-messages",
        "empty",
        "last-not-object",
        "number-too-long-to-scan",
    ],
)
def test_no_end_is_given_where_the_parsed_messages_do_not_end(raw: bytes) -> None:
    assert messages_end(raw, orjson.loads(raw)) is None


def test_the_end_given_is_after_the_last_message_of_the_array_the_parse_took() -> None:
    raw = b'{"model":"]}\\"", "messages" :\n[ {"content":"a]\\\\"} ,{"role":"x"}\n ] ,"t":[1,{"q":"\\\\"}]}'
    end = messages_end(raw, orjson.loads(raw))
    assert end is not None
    assert raw[:end].endswith(b'{"role":"x"}')


@pytest.mark.parametrize(
    "inserted",
    [b'{"a":1}', b',{"a":1}],[{"b":2}', b",1", b",", b', {"a":1},', b',{"a":1}]}', b',{"a":"\\u00"}'],
    ids=["no-comma", "closes-the-array", "not-an-object", "nothing", "trailing-comma", "closes-the-body", "bad-escape"],
)
def test_inserted_bytes_that_are_not_messages_are_refused(inserted: bytes) -> None:
    assert appended_messages(inserted) is None


@pytest.mark.parametrize("depth", [1020, 1021, 1022, 1023])
def test_new_messages_are_held_to_the_parsers_depth_limit_as_in_a_whole_body(depth: int) -> None:
    message = b'{"content":' + b"[" * depth + b"]" * depth + b"}"
    whole = b'{"messages":[{"role":"user"},' + message + b"]}"
    try:
        parses = bool(orjson.loads(whole))
    except orjson.JSONDecodeError:
        parses = False
    assert (appended_messages(b"," + message) is not None) == parses


@pytest.mark.parametrize(
    "raw",
    [b'{"a\\x":1}', b'{"\xff":1,"messages":[{}]}', b"{", b"", b'{"messages":[{"a":"\\', b'"x', b"[1]", b"\xef\xbb"],
)
async def test_bytes_that_are_not_a_chat_body_are_not_recognized_and_raise_nothing(raw: bytes) -> None:
    splices = await remembered(orjson.dumps({"model": "m", "messages": TRICKY}))
    assert splices.match(SCOPE, raw, opening_ends(raw)) is None
