"""A stream's opening events are held back only until they show whether the request was refused."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable

from hypothesis import given
from hypothesis import strategies as st

from proxy.server.stream_prelude import PRELUDE_LIMIT, read_prelude


def sse(*events: dict[str, object]) -> bytes:
    return b"".join(f"event: {e.get('type', 'x')}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def reader(data: bytes, cuts: list[int]) -> Callable[[], Awaitable[bytes]]:
    points = sorted({0, *(cut % (len(data) + 1) for cut in cuts), len(data)})
    pieces = [data[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def read() -> bytes:
        return pieces.pop(0) if pieces else b""

    return read


OPENING = sse({"type": "response.created"}, {"type": "response.in_progress"})
ERROR = {"type": "error", "error": {"code": "context_length_exceeded", "message": "too long", "param": "input"}}


@given(cuts=st.lists(st.integers(0, 10_000), max_size=8))
async def test_an_error_after_the_opening_events_is_a_refusal(cuts: list[int]) -> None:
    data = OPENING + sse(ERROR)
    prelude = await read_prelude(reader(data, cuts))
    assert prelude.refusal == {"error": ERROR["error"]}
    assert prelude.data == data


async def test_a_failed_response_is_a_refusal_and_an_answer_is_not() -> None:
    failed = {"type": "response.failed", "response": {"error": {"code": "server_error", "message": "oops"}}}
    assert (await read_prelude(reader(OPENING + sse(failed), []))).refusal == {"error": failed["response"]["error"]}
    answer = OPENING + sse({"type": "response.output_item.added"}, {"type": "response.completed"})
    prelude = await read_prelude(reader(answer, list(range(0, len(answer), 20))))
    assert prelude.refusal is None
    assert answer.startswith(prelude.data) and len(prelude.data) < len(answer)


async def test_a_chat_stream_ends_the_prelude_at_its_first_chunk() -> None:
    chunks = b"".join(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n' for _ in range(50))
    prelude = await read_prelude(reader(chunks, list(range(0, len(chunks), 40))))
    assert prelude.refusal is None and len(prelude.data) <= 80


async def test_a_stream_of_opening_events_only_is_held_back_no_further_than_the_limit() -> None:
    endless = sse(*[{"type": "response.in_progress", "pad": "x" * 1000}] * 400)
    prelude = await read_prelude(reader(endless, list(range(0, len(endless), 4096))))
    assert prelude.refusal is None and PRELUDE_LIMIT <= len(prelude.data) < PRELUDE_LIMIT + 4096
