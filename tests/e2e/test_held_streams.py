"""The one hold on a streamed answer, end to end: overflow retries with the read tool, and early status lines.

An upstream that refuses an oversized request inside a 200 stream is compacted and retried whether or not the proxy
offered its read tool, also when the refusal answers a read round. A model that reasons before it decides whether to
read holds the client's events, never its status line and headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from proxy.pipeline.offload.reads import TOO_LARGE
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.openai_upstream import OpenAIUpstream, Reply
from proxy.simulator.responses_api import ResponsesReply
from tests.e2e.conftest import MODEL, WINDOW, StartProxy
from tests.e2e.test_offload_reads import (
    CLIENT_TOOLS,
    LOG,
    RESPONSES_TOOLS,
    chat_bodies,
    conversation,
    response_items,
    tool_names,
)
from tests.support.proxies import LoopbackProxies
from tests.support.reading_model import (
    PLAIN_ANSWER,
    found_answer,
    reading_chat_responder,
    reading_responses_responder,
)

PREVIEW_ANSWER = "answered from the preview"


def answer_without_tools(request: dict[str, Any]) -> bool:
    return request.get("tool_choice") == "none"


async def streamed_text(sdk: openai.AsyncOpenAI, api: str, extra_headers: dict[str, str]) -> tuple[str, Any]:
    """Ask for a stream through the proxy; return the text the client received, and the response headers."""
    big = LOG * 2  # over the upstream's window; the proxy believes the model has 16k
    if api == "chat":
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(big), tools=CLIENT_TOOLS, stream=True, extra_headers=extra_headers
        )
        deltas = [choice.delta.content or "" async for chunk in raw.parse() for choice in chunk.choices]
        return "".join(deltas), raw.headers
    raw = await sdk.responses.with_raw_response.create(
        model=MODEL, input=response_items(big), tools=RESPONSES_TOOLS, stream=True, extra_headers=extra_headers
    )
    events = [event async for event in raw.parse()]
    return "".join(getattr(event, "delta", "") for event in events if event.type == "response.output_text.delta"), (
        raw.headers
    )


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("offload", ["on", "off"])
async def test_an_overflow_inside_the_stream_is_retried_with_or_without_the_read_tool(
    upstream: OpenAIUpstream, start_proxy: StartProxy, api: str, offload: str
) -> None:
    upstream.chat_overflow_in_stream = upstream.responses_overflow_in_stream = True
    upstream.responder = lambda request: (
        Reply(content=PREVIEW_ANSWER) if answer_without_tools(request) else reading_chat_responder(request)
    )
    upstream.responses_responder = lambda request: (
        ResponsesReply(text=PREVIEW_ANSWER) if answer_without_tools(request) else reading_responses_responder(request)
    )
    headers = {"X-Compaction-Offload": offload}
    base_url = await start_proxy(context_windows={MODEL: 16_384})
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        text, received = await streamed_text(sdk, api, headers)
    assert received["x-compaction"] == "compacted-after-overflow"
    bodies = chat_bodies(upstream) if api == "chat" else upstream.responses_requests
    if offload == "off":
        assert text == PLAIN_ANSWER
        assert len(bodies) == 2
        return
    # The retry offered the read tool and the model read. What it asked for would not fit the window the overflow
    # taught, so the proxy answered the read "too large" instead of sending it: the client never sees an error.
    _overflowed, retried, answered = bodies
    assert tool_names(retried)[-1] == READ_TOOL
    read = answered["messages"][-1]["content"] if api == "chat" else answered["input"][-1]["output"]
    assert read == TOO_LARGE
    assert text == found_answer([TOO_LARGE])


class ReasoningUpstream:
    """An upstream that reasons until the test has seen the proxy's status line, then answers.

    It streams reasoning deltas (chat's `reasoning_content`, the Responses reasoning summary) one per turn of the
    event loop until `headers_seen` is set, then its first decisive event (text) and the end of the stream. `reasoned`
    counts the reasoning bytes sent before that.
    """

    def __init__(self) -> None:
        self.headers_seen = asyncio.Event()
        self.reasoned = 0
        self.requests: list[dict[str, Any]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        opening = [chunk({"role": "assistant", "content": ""})]
        thought = chunk({"reasoning_content": "Weighing whether the offloaded log is needed. "})
        answer = [chunk({"content": "The build failed."}), chunk({}, "stop")]
        return await self._stream(request, opening, thought, answer, b"data: [DONE]\n\n")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        shell = {"id": "resp_1", "object": "response", "model": MODEL, "status": "in_progress", "output": []}
        reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "The build failed.", "annotations": []}],
        }
        usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
        done = {**shell, "status": "completed", "output": [reasoning, message], "usage": usage}
        opening = [
            {"type": "response.created", "response": shell},
            {"type": "response.in_progress", "response": shell},
            {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
        ]
        thought = {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": "Weighing whether the offloaded log is needed. ",
        }
        answer = [
            {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
            {"type": "response.output_item.added", "output_index": 1, "item": {**message, "content": []}},
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 1,
                "content_index": 0,
                "delta": "The build failed.",
            },
            {"type": "response.output_item.done", "output_index": 1, "item": message},
            {"type": "response.completed", "response": done},
        ]
        return await self._stream(request, opening, thought, answer, b"")

    async def _stream(
        self,
        request: web.Request,
        opening: list[dict[str, Any]],
        thought: dict[str, Any],
        answer: list[dict[str, Any]],
        trailer: bytes,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in opening:
            await response.write(_frame(event))
        while not self.headers_seen.is_set():
            frame = _frame(thought)
            await response.write(frame)
            self.reasoned += len(frame)
            await asyncio.sleep(0)  # a turn of the event loop per delta (no time passes): the proxy reads meanwhile
        for event in answer:
            await response.write(_frame(event))
        await response.write(trailer)
        await response.write_eof()
        return response


def _frame(event: dict[str, Any]) -> bytes:
    named = f"event: {event['type']}\n".encode() if "type" in event else b""
    return named + b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.fixture
async def reasoning_upstream() -> AsyncIterator[tuple[ReasoningUpstream, str]]:
    fake = ReasoningUpstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_post("/v1/responses", fake.responses)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield fake, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


HOLD_LIMIT = 256 * 1024
"""The proxy's `max_body_bytes` here: what it holds of an undecided answer at most."""


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_reasoning_stream_gets_its_status_line_before_the_model_decides(
    reasoning_upstream: tuple[ReasoningUpstream, str], api: str
) -> None:
    fake, url = reasoning_upstream
    proxies = LoopbackProxies(upstream=url, context_windows={MODEL: WINDOW}, max_body_bytes=HOLD_LIMIT)
    proxy = await proxies.start()
    if api == "chat":
        path, body = "/chat/completions", {"model": MODEL, "messages": conversation(), "tools": CLIENT_TOOLS}
    else:
        path, body = "/responses", {"model": MODEL, "input": response_items(), "tools": RESPONSES_TOOLS}
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(proxy.url + path, json={**body, "stream": True}) as got,
        ):
            reasoned_before_headers = fake.reasoned
            fake.headers_seen.set()
            received = await got.read()
    finally:
        await proxies.close()
    assert got.status == 200 and got.headers["X-Compaction-Offloaded"] == "1"
    assert tool_names(fake.requests[0])[-1] == READ_TOOL  # the read tool was offered: the stream was held
    # The status line came while the model was still reasoning, not once the proxy gave up holding its events.
    assert reasoned_before_headers < HOLD_LIMIT // 8
    assert b"Weighing whether" in received and b"The build failed." in received


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("failure", ["status", "reset"])
async def test_a_failure_after_the_stream_opened_ends_it_with_an_error_event(
    upstream: OpenAIUpstream, start_proxy: StartProxy, api: str, failure: str
) -> None:
    def fail_what_follows() -> None:
        if failure == "status":
            upstream.fail_next(500, times=2)  # the request asking again, and the one asking without tools
        else:
            upstream.fail_next(reset=True)

    def chat(request: dict[str, Any]) -> Reply:
        fail_what_follows()
        return reading_chat_responder(request)

    def responses(request: dict[str, Any]) -> ResponsesReply:
        fail_what_follows()
        return reading_responses_responder(request)

    upstream.responder, upstream.responses_responder = chat, responses
    async with openai.AsyncOpenAI(base_url=await start_proxy(), api_key="k", max_retries=0) as sdk:
        if api == "chat":
            raw = await sdk.chat.completions.with_raw_response.create(
                model=MODEL, messages=conversation(), tools=CLIENT_TOOLS, stream=True
            )
        else:
            raw = await sdk.responses.with_raw_response.create(
                model=MODEL, input=response_items(), tools=RESPONSES_TOOLS, stream=True
            )
        assert raw.http_response.status_code == 200  # sent before the model decided to read
        with pytest.raises(openai.APIError) as raised:
            _ = [event async for event in raw.parse()]
    expected = "The upstream could not be reached" if failure == "reset" else "The server had an error"
    assert raised.value.message.startswith(expected)
