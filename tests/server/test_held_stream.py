"""The hold every answer to a compacted request goes through: held only until its first decisive event."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.formats.responses.wire import RESPONSES
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.wire import WireFormat
from proxy.server.held_stream import OPENING_LIMIT, Held, Read, hold


def sse(*events: dict[str, object]) -> bytes:
    return b"".join(f"event: {e.get('type', 'x')}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def reader(data: bytes, cuts: list[int]) -> Read:
    points = sorted({0, *(cut % (len(data) + 1) for cut in cuts), len(data)})
    pieces = [data[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def read() -> bytes:
        return pieces.pop(0) if pieces else b""

    return read


class Opening:
    """Counts how often the hold opened the client's stream."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> None:
        self.count += 1


async def held(
    data: bytes, api: WireFormat, cuts: list[int] | None = None, *, reads: bool = False, limit: int = 1 << 20
) -> tuple[Held, int]:
    opened = Opening()
    read = reader(data, cuts or [])
    per_answer = 8 if reads else None
    result = await hold(read, api, streamed=True, offered=reads, reads=per_answer, limit=limit, opened=opened)
    return result, opened.count


OPENING = sse({"type": "response.created"}, {"type": "response.in_progress"})
ERROR = {"type": "error", "error": {"code": "context_length_exceeded", "message": "too long", "param": "input"}}
REASONING = {"type": "response.reasoning_summary_text.delta", "delta": "thinking"}


@given(cuts=st.lists(st.integers(0, 10_000), max_size=8), reads=st.booleans())
async def test_an_error_after_the_opening_events_is_a_refusal(cuts: list[int], reads: bool) -> None:
    data = OPENING + sse(ERROR)
    result, opened = await held(data, RESPONSES, cuts, reads=reads)
    assert (result.refusal, result.head, opened) == ({"error": ERROR["error"]}, data, 0)


@given(cuts=st.lists(st.integers(0, 10_000), max_size=8), reads=st.booleans())
async def test_a_chat_stream_that_is_an_error_is_a_refusal(cuts: list[int], reads: bool) -> None:
    data = b'data: {"error": {"code": "context_length_exceeded", "message": "too long"}}\n\n'
    result, opened = await held(data, CHAT_COMPLETIONS, cuts, reads=reads)
    assert (result.refusal, opened) == ({"error": {"code": "context_length_exceeded", "message": "too long"}}, 0)


async def test_a_refusal_after_reasoning_is_a_refusal_too() -> None:
    data = OPENING + sse(REASONING, REASONING, ERROR)
    result, opened = await held(data, RESPONSES, reads=True)
    assert (result.refusal, opened) == ({"error": ERROR["error"]}, 1)


@pytest.mark.parametrize("reads", [False, True])
async def test_an_event_of_an_odd_shape_is_relayed(reads: bool) -> None:
    data = OPENING + sse({"type": ["response.created"]}, {"type": {"error": 1}, "error": "x"})
    result, _ = await held(data, RESPONSES, reads=reads)
    assert (result.refusal, result.reads) == (None, None)


async def test_a_failed_response_is_a_refusal_and_an_answer_is_not() -> None:
    failed = {"type": "response.failed", "response": {"error": {"code": "server_error", "message": "oops"}}}
    assert (await held(OPENING + sse(failed), RESPONSES))[0].refusal == {"error": failed["response"]["error"]}
    answer = OPENING + sse({"type": "response.output_item.added"}, {"type": "response.completed"})
    result, _ = await held(answer, RESPONSES, list(range(0, len(answer), 20)))
    assert result.refusal is None and result.reads is None
    assert answer.startswith(result.head) and len(result.head) < len(answer)


async def test_a_chat_stream_without_the_read_tool_is_decided_at_its_first_chunk() -> None:
    chunks = b"".join(b'data: {"choices": [{"delta": {"reasoning_content": "hm"}}]}\n\n' for _ in range(50))
    result, opened = await held(chunks, CHAT_COMPLETIONS, list(range(0, len(chunks), 40)))
    assert result.refusal is None and len(result.head) <= 80 and opened == 0


async def test_reasoning_is_held_with_the_read_tool_but_the_stream_opens_at_once() -> None:
    thinking = b"".join(b'data: {"choices": [{"delta": {"reasoning_content": "hm"}}]}\n\n' for _ in range(50))
    content = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    result, opened = await held(thinking + content + content, CHAT_COMPLETIONS, [60, 120], reads=True)
    assert (result.refusal, result.reads, opened) == (None, None, 1)
    assert result.head.startswith(thinking + content)


@pytest.mark.parametrize("reads", [False, True])
async def test_a_stream_of_opening_events_only_is_held_no_further_than_the_opening_limit(reads: bool) -> None:
    endless = sse(*[{"type": "response.in_progress", "pad": "x" * 1000}] * 400)
    result, opened = await held(endless, RESPONSES, list(range(0, len(endless), 4096)), reads=reads)
    assert result.refusal is None and OPENING_LIMIT < len(result.head) <= OPENING_LIMIT + 4096 and opened == 0


async def test_reasoning_is_held_no_further_than_the_limit() -> None:
    endless = OPENING + sse(*[{**REASONING, "delta": "x" * 1000}] * 400)
    result, opened = await held(endless, RESPONSES, list(range(0, len(endless), 4096)), reads=True, limit=300_000)
    assert result.reads is None and 300_000 < len(result.head) <= 300_000 + 4096 and opened == 1


CHAT_EVENTS = {
    "role": {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    "reasoning": {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
    "content": {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
    "read": {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "id": "r", "function": {"name": READ_TOOL, "arguments": "{}"}}]},
            }
        ]
    },
    "client call": {
        "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}}]
    },
    "error": {"error": {"code": "context_length_exceeded", "message": "too long"}},
}


def expected(kinds: list[str], reads: bool) -> tuple[str, int]:
    """What the hold decides for chat events of these kinds, and how often it opens the client's stream."""
    if kinds and kinds[0] == "error":
        return "refusal", 0
    if not reads:
        return "relay", 0
    for kind in kinds:
        if kind == "error":
            return "refusal", 1
        if kind in {"content", "client call"}:
            return "relay", 1
        if kind == "read":
            return "read round", 1
    return "relay", int(bool(kinds))


@given(
    kinds=st.lists(st.sampled_from(sorted(CHAT_EVENTS)), max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    reads=st.booleans(),
)
async def test_a_chat_stream_is_decided_by_its_first_decisive_event_however_it_is_cut(
    kinds: list[str], cuts: list[int], reads: bool
) -> None:
    data = b"".join(b"data: " + json.dumps(CHAT_EVENTS[kind]).encode() + b"\n\n" for kind in kinds)
    result, opened = await held(data + b"data: [DONE]\n\n", CHAT_COMPLETIONS, cuts, reads=reads)
    decided = "refusal" if result.refusal else "read round" if result.reads else "relay"
    assert (decided, opened) == expected(kinds, reads)
    assert (data + b"data: [DONE]\n\n").startswith(result.head)
